//! The applications the evaluation runs, their inputs (generated, deterministic) and the sizes
//! it profiles and measures them at.

use sonic_lambdas::{ml, video};

use crate::demo::sort_records;

/// What one job's input is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputKind {
    /// MapReduce sort records, this many bytes.
    SortBytes,
    /// An ML CSV with this many rows.
    MlRows,
    /// A Y4M video of this many seconds.
    VideoSeconds,
}

/// One application of the evaluation.
#[derive(Debug, Clone)]
pub struct App {
    pub name: &'static str,
    pub file: &'static str,
    pub yaml: &'static str,
    pub input: InputKind,
    /// The input's name under `input/`.
    pub input_name: &'static str,
    /// The range the profiling jobs' sizes span (in the input's unit).
    pub lo: u64,
    pub hi: u64,
    /// The unit of `lo`/`hi` in the report.
    pub unit: &'static str,
}

/// The paper's three applications.
pub fn apps() -> Vec<App> {
    vec![
        App {
            name: "mapreduce-sort",
            file: "dags/mapreduce-sort.yaml",
            yaml: include_str!("../../../../dags/mapreduce-sort.yaml"),
            input: InputKind::SortBytes,
            input_name: "records.bin",
            lo: 4_000_000,
            hi: 32_000_000,
            unit: "bytes",
        },
        App {
            name: "ml-pipeline",
            file: "dags/ml-pipeline.yaml",
            yaml: include_str!("../../../../dags/ml-pipeline.yaml"),
            input: InputKind::MlRows,
            input_name: "train.csv",
            lo: 2_000,
            hi: 16_000,
            unit: "rows",
        },
        App {
            name: "video-analytics",
            file: "dags/video-analytics.yaml",
            yaml: include_str!("../../../../dags/video-analytics.yaml"),
            input: InputKind::VideoSeconds,
            input_name: "video.y4m",
            lo: 40,
            hi: 320,
            unit: "seconds",
        },
    ]
}

/// The broadcast microbenchmark of Fig. 6.
pub const BROADCAST_YAML: &str = include_str!("../../../../dags/broadcast.yaml");

/// The sizes profiling runs at: `train` spans `[lo, hi]` evenly, in an order that covers the
/// range early (the first k jobs of Fig. 10 are spread out, as online profiling of varied inputs
/// would be); `test` lies between the training sizes and is held out of Fig. 10's fits. The
/// measured jobs run at `train`'s middle size, which the oracle has measurements of.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizes {
    pub train: Vec<u64>,
    pub test: Vec<u64>,
    pub measured: u64,
}

/// `n_train` training sizes and `n_test` held-out ones for `app`.
pub fn sizes(app: &App, n_train: usize, n_test: usize) -> Sizes {
    let n = n_train.max(2);
    let step = (app.hi - app.lo) as f64 / (n - 1) as f64;
    let round = |v: f64| -> u64 {
        match app.input {
            // Whole records.
            InputKind::SortBytes => ((v / 100.0).round() as u64) * 100,
            _ => v.round() as u64,
        }
    };
    let grid: Vec<u64> = (0..n)
        .map(|i| round(app.lo as f64 + step * i as f64))
        .collect();
    let measured = grid[n / 2];
    // Ends first, then halves: 0, n-1, middle, quarters...
    let mut order: Vec<usize> = vec![0, n - 1];
    let mut parts = vec![(0usize, n - 1)];
    while order.len() < n {
        let mut next = Vec::new();
        for (a, b) in parts {
            if b > a + 1 {
                let m = (a + b) / 2;
                if !order.contains(&m) {
                    order.push(m);
                }
                next.push((a, m));
                next.push((m, b));
            }
        }
        if next.is_empty() {
            break;
        }
        parts = next;
    }
    for i in 0..n {
        if !order.contains(&i) {
            order.push(i);
        }
    }
    let train = order.iter().map(|&i| grid[i]).collect();
    let test = (0..n_test)
        .map(|j| {
            // Midpoints between training sizes, spread over the range.
            let k = ((j as f64 + 0.5) * (n - 1) as f64 / n_test.max(1) as f64).floor() as usize;
            let k = k.min(n - 2);
            round(app.lo as f64 + step * (k as f64 + 0.5))
        })
        .collect();
    Sizes {
        train,
        test,
        measured,
    }
}

/// The input of one job of `app` at `size`.
pub fn input(app: &App, size: u64) -> anyhow::Result<Vec<u8>> {
    Ok(match app.input {
        InputKind::SortBytes => sort_records(size, size),
        InputKind::MlRows => {
            let mut out = Vec::new();
            ml::generate(
                &mut out,
                &ml::GenSpec {
                    rows: size,
                    seed: 1,
                    features: 16,
                    classes: 4,
                },
            )?;
            out
        }
        InputKind::VideoSeconds => {
            let mut out = Vec::new();
            let spec = video::VideoSpec {
                seconds: u32::try_from(size)?,
                ..video::VideoSpec::default()
            };
            video::generate(&mut out, &spec)?;
            out
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_span_the_range_and_hold_out_others() {
        for app in apps() {
            let s = sizes(&app, 6, 2);
            assert_eq!(s.train.len(), 6);
            assert_eq!(s.test.len(), 2);
            let mut sorted = s.train.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 6, "{}: distinct training sizes", app.name);
            assert_eq!((sorted[0], sorted[5]), (app.lo, app.hi));
            assert!(s.train.contains(&s.measured));
            // Ends first: the first two jobs span the range.
            assert_eq!(s.train[..2], [app.lo, app.hi]);
            for t in &s.test {
                assert!(!s.train.contains(t) && *t > app.lo && *t < app.hi);
            }
            let full = sizes(&app, 12, 4);
            assert_eq!(full.train.len(), 12);
            assert_eq!(full.test.len(), 4);
        }
    }

    #[test]
    fn inputs_have_the_size_asked_for() {
        let a = apps();
        assert_eq!(input(&a[0], 1_000).unwrap().len(), 1_000);
        let csv = input(&a[1], 100).unwrap();
        assert_eq!(csv.iter().filter(|b| **b == b'\n').count(), 101);
        let y4m = input(&a[2], 2).unwrap();
        assert!(y4m.starts_with(b"YUV4MPEG2"));
    }
}
