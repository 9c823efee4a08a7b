//! The applications the evaluation runs, their inputs (generated, deterministic) and the sizes
//! it profiles and measures them at.

use sonic_lambdas::{ml, video};

/// gensort-like records (docs/applications.md): a 10-byte random key, `00 11`, the record number
/// in 32 hex digits, `88 99 AA BB`, 48 filler characters, `CC DD EE FF`.
pub fn sort_records(bytes: u64, seed: u64) -> Vec<u8> {
    let records = bytes / 100;
    let mut out = Vec::with_capacity((records * 100) as usize);
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in 0..records {
        let a = next().to_be_bytes();
        let b = next().to_be_bytes();
        out.extend_from_slice(&a);
        out.extend_from_slice(&b[..2]);
        out.extend_from_slice(&[0x00, 0x11]);
        out.extend_from_slice(format!("{i:032X}").as_bytes());
        out.extend_from_slice(&[0x88, 0x99, 0xAA, 0xBB]);
        let filler = b'A' + (i % 26) as u8;
        out.extend(std::iter::repeat_n(filler, 48));
        out.extend_from_slice(&[0xCC, 0xDD, 0xEE, 0xFF]);
    }
    out
}

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
    /// The size Fig. 7 measures at (in `[lo, hi]`; profiling runs at it too, so that the oracle
    /// has its measurements): the paper's where this machine allows (docs/evaluation.md).
    pub measured: u64,
    /// Job parameters of every job of the application (profiling and measured): the paper's
    /// fanouts.
    pub params: &'static [(&'static str, u32)],
}

impl App {
    /// [`App::params`] as a job's parameter overrides.
    pub fn job_params(&self) -> Vec<(String, serde_json::Value)> {
        self.params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect()
    }
}

/// The frame rate of the evaluation's videos: at 64x48 pixels, 18 frames a second make the
/// paper's 3-minute video 15 MB, the paper's size (§5.4).
pub const VIDEO_FPS: u32 = 18;

/// The paper's three applications, at the paper's fanouts (§5.4: sort 30, LightGBM 6, video 19)
/// and, where this machine allows, its sizes; docs/evaluation.md says why the others are smaller.
pub fn apps() -> Vec<App> {
    vec![
        App {
            name: "mapreduce-sort",
            file: "dags/mapreduce-sort.yaml",
            yaml: include_str!("../../../dags/mapreduce-sort.yaml"),
            input: InputKind::SortBytes,
            input_name: "records.bin",
            // The paper sorts 1.5 GB; every job's result stays in the store (1.5 GB x ~45
            // jobs is more disk than this machine has) and the CPU time grows with it.
            lo: 8_000_000,
            hi: 128_000_000,
            unit: "bytes",
            measured: 64_000_000,
            params: &[("mappers", 30), ("reducers", 30)],
        },
        App {
            name: "ml-pipeline",
            file: "dags/ml-pipeline.yaml",
            yaml: include_str!("../../../dags/ml-pipeline.yaml"),
            input: InputKind::MlRows,
            input_name: "train.csv",
            // The paper trains on 200 MB (1.7 M rows here); training grows faster than the
            // rows, and ~110 ML jobs run (profiling, Fig. 7, Fig. 2).
            lo: 4_000,
            hi: 32_000,
            unit: "rows",
            measured: 16_000,
            params: &[("trees", 6)],
        },
        App {
            name: "video-analytics",
            file: "dags/video-analytics.yaml",
            yaml: include_str!("../../../dags/video-analytics.yaml"),
            input: InputKind::VideoSeconds,
            input_name: "video.y4m",
            lo: 40,
            hi: 320,
            unit: "seconds",
            // The paper's 3-minute video with fanout 19 (10 s chunks): 181 to 190 s.
            measured: 185,
            params: &[("chunk_seconds", 10)],
        },
    ]
}

/// The broadcast microbenchmark of Fig. 6.
pub const BROADCAST_YAML: &str = include_str!("../../../dags/broadcast.yaml");

/// The sizes profiling runs at: `train` spans `[lo, hi]` evenly, in an order that covers the
/// range early (the first k jobs of Fig. 10 are spread out, as online profiling of varied inputs
/// would be); `test` lies between the training sizes and is held out of Fig. 10's fits. The
/// measured jobs run at the application's `measured` size, which replaces the training size
/// nearest it (so that the oracle has measurements of it).
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
    let mut grid: Vec<u64> = (0..n)
        .map(|i| round(app.lo as f64 + step * i as f64))
        .collect();
    let measured = round(app.measured.clamp(app.lo, app.hi) as f64);
    // The inner grid point nearest the measured size becomes it (the ends stay the range's).
    if !grid.contains(&measured) && n > 2 {
        let nearest = (1..n - 1)
            .min_by_key(|&i| grid[i].abs_diff(measured))
            .unwrap_or(n / 2);
        grid[nearest] = measured;
    }
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
                fps: VIDEO_FPS,
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
    fn records_have_the_documented_layout() {
        let r = sort_records(1050, 1);
        assert_eq!(r.len(), 1000, "whole records only");
        for (i, rec) in r.chunks(100).enumerate() {
            assert_eq!(&rec[10..12], &[0x00, 0x11]);
            assert_eq!(&rec[12..44], format!("{i:032X}").as_bytes());
            assert_eq!(&rec[44..48], &[0x88, 0x99, 0xAA, 0xBB]);
            assert_eq!(&rec[96..100], &[0xCC, 0xDD, 0xEE, 0xFF]);
        }
        assert_ne!(&r[0..10], &r[100..110], "keys differ");
        assert_eq!(sort_records(500, 7), sort_records(500, 7), "deterministic");
    }

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
            assert_eq!(full.measured, app.measured);
            assert!(full.train.contains(&app.measured), "{}", app.name);
        }
    }

    #[test]
    fn the_measured_jobs_are_the_papers_where_the_machine_allows() {
        let a = apps();
        // Sort at fanout 30 (mappers and reducers), LightGBM with 6 trees.
        assert_eq!(a[0].params, [("mappers", 30), ("reducers", 30)]);
        assert_eq!(a[1].params, [("trees", 6)]);
        // Video: a 3-minute video of 15 MB whose 10 s chunks make fanout 19.
        let video = &a[2];
        let chunk = video.params[0].1;
        assert_eq!(video.measured.div_ceil(u64::from(chunk)), 19);
        assert!((180..190).contains(&video.measured));
        let bytes = input(video, video.measured).unwrap().len() as f64;
        assert!((14e6..16e6).contains(&bytes), "{bytes} bytes");
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
