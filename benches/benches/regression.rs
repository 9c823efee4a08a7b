//! Regression fitting time: one parameter's model refitted (degrees 1 to 3, 5-fold
//! cross-validation, the final fit) at 50 and 500 samples, and a whole DAG's models taking one
//! more job's measurements (3 functions x 4 parameters + 2 edges, each refitted).
//!
//! `cargo bench -p sonic-benches --bench regression [-- --quick]`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sonic_core::params::{EdgeParams, FunctionParams, Params};
use sonic_core::regression::{Convergence, DagModels, Model, Quantity};
use sonic_core::units::ByteSize;

/// A quadratic with a few percent of deterministic noise.
fn sample(i: usize) -> (f64, f64) {
    let x = 1e6 * (1 + i % 97) as f64 * (1.0 + (i / 97) as f64 * 0.01);
    let noise = 1.0 + 0.03 * ((i * 7919 % 101) as f64 / 101.0 - 0.5);
    (x, (2e-12 * x * x + 3e-6 * x + 40.0) * noise)
}

fn params(x: f64) -> Params {
    let f = |mem: f64, t: f64, k: u32| FunctionParams {
        parallel: 0.0,
        memory_mb: mem,
        cold_s: t,
        hot_s: 0.9 * t,
        instances: k,
        overhead_s: 0.0,
        overhead_hot_s: None,
        start_s: 0.0,
        cold_dist: None,
        hot_dist: None,
    };
    Params {
        functions: [
            (
                "pca".to_owned(),
                f(500.0 + 1e-5 * x, 2.0 + 3e-16 * x * x, 1),
            ),
            ("train".to_owned(), f(900.0 + 2e-6 * x, 5.0 + 4e-8 * x, 6)),
            ("combine".to_owned(), f(200.0, 1.0, 1)),
        ]
        .into(),
        edges: vec![
            EdgeParams {
                from: "pca".into(),
                to: "train".into(),
                bytes: ByteSize((0.6 * x) as u64),
            },
            EdgeParams {
                from: "train".into(),
                to: "combine".into(),
                bytes: ByteSize(6_000_000),
            },
        ],
    }
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("fit");
    for n in [50usize, 500] {
        let mut m = Model::new(Quantity::Time, 42);
        for i in 0..n {
            let (x, y) = sample(i);
            m.add_sample(x, y).expect("finite");
        }
        g.bench_with_input(BenchmarkId::from_parameter(n), &m, |b, m| {
            b.iter_batched(
                || m.clone(),
                |mut m| m.fit().map(|f| f.degree).expect("fits"),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    let mut g = c.benchmark_group("dag-add-sample");
    for n in [50usize, 500] {
        let mut dm = DagModels::for_names(
            &["pca".into(), "train".into(), "combine".into()],
            &[
                ("pca".into(), "train".into()),
                ("train".into(), "combine".into()),
            ],
            Convergence::default(),
            7,
        );
        for i in 0..n {
            let x = sample(i).0;
            dm.add_params(x, &params(x)).expect("known names");
        }
        let next = params(123e6);
        g.bench_with_input(BenchmarkId::from_parameter(n), &dm, |b, dm| {
            b.iter_batched(
                || dm.clone(),
                |mut dm| dm.add_params(black_box(123e6), &next).expect("known names"),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = regression;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(regression);
