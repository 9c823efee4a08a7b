//! The DAG parser against generated files: any acyclic DAG written in any function order parses
//! to the same functions and edges, topologically ordered; adding a back edge is always refused.

use proptest::prelude::*;
use sonic_core::dag::Dag;

/// n functions, edges (i, j) with i < j in a hidden order, written in a shuffled order.
fn spec() -> impl Strategy<Value = (usize, Vec<(usize, usize)>, Vec<usize>, u32)> {
    (2usize..8).prop_flat_map(|n| {
        let pairs: Vec<(usize, usize)> = (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
            .collect();
        (
            Just(n),
            proptest::sample::subsequence(pairs.clone(), 0..=pairs.len()),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            1u32..5,
        )
    })
}

fn yaml(n: usize, edges: &[(usize, usize)], order: &[usize], k: u32) -> String {
    let mut s = String::from("name: gen\nfunctions:\n");
    for &i in order.iter().take(n) {
        s +=
            &format!("  - {{ name: f{i}, image: img, command: [run, \"{i}\"], instances: {k} }}\n");
    }
    s += "edges:\n";
    for (a, b) in edges {
        s += &format!("  - {{ from: f{a}, to: f{b}, kind: one }}\n");
    }
    s
}

proptest! {
    #[test]
    fn generated_dags_round_trip((n, edges, order, k) in spec()) {
        let dag = Dag::from_yaml("gen.yaml", &yaml(n, &edges, &order, k)).expect("valid");
        prop_assert_eq!(dag.functions.len(), n);
        prop_assert_eq!(dag.edges.len(), edges.len());
        for e in &dag.edges {
            prop_assert!(e.from < e.to, "not topological");
        }
        let mut got: Vec<(String, String)> = dag
            .edges
            .iter()
            .map(|e| (dag.functions[e.from].name.clone(), dag.functions[e.to].name.clone()))
            .collect();
        let mut want: Vec<(String, String)> = edges.iter().map(|(a, b)| (format!("f{a}"), format!("f{b}"))).collect();
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
        for f in &dag.functions {
            prop_assert_eq!(&f.command[1], &f.name[1..]);
        }
    }

    #[test]
    fn a_back_edge_on_a_path_is_a_cycle((n, order, k) in (3usize..8).prop_flat_map(|n| (Just(n), Just((0..n).collect::<Vec<_>>()).prop_shuffle(), 1u32..4))) {
        // A path 0 -> 1 -> ... -> n-1 plus n-1 -> 0.
        let mut edges: Vec<(usize, usize)> = (0..n - 1).map(|i| (i, i + 1)).collect();
        edges.push((n - 1, 0));
        let err = Dag::from_yaml("cyc.yaml", &yaml(n, &edges, &order, k)).expect_err("cycle");
        prop_assert!(err.to_string().contains("cycle"), "{}", err);
    }
}
