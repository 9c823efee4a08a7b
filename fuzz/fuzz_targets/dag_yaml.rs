//! `Dag::from_yaml` on any bytes: never a panic; an accepted DAG holds the checked invariants; a
//! refusal names the file and, with a line, a column.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sonic_core::dag::{self, Dag};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Dag::from_yaml("fuzz.yaml", &text) {
        Ok(d) => {
            assert!(dag::valid_dag_name(&d.name));
            assert!(!d.functions.is_empty() && d.functions.len() <= dag::MAX_FUNCTIONS);
            for f in &d.functions {
                assert!(dag::valid_function_name(&f.name));
                assert!(dag::valid_image(&f.image));
                assert!(!f.command.is_empty() && f.command.iter().all(|w| !w.contains('\0')));
                assert!(f.timeout_s > 0.0 && f.timeout_s <= 86_400.0);
            }
            for e in &d.edges {
                assert!(e.from < e.to && e.to < d.functions.len());
            }
            assert!(d.fanouts(&d.params).is_ok());
        }
        Err(e) => {
            assert!(e.to_string().starts_with("fuzz.yaml"));
            assert_eq!(e.line.is_some(), e.column.is_some());
            assert!(!e.message.is_empty());
        }
    }
});
