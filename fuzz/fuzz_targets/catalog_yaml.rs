//! `Catalog::from_yaml` on any bytes: never a panic; an accepted catalog checks and round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sonic_core::catalog::Catalog;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(c) = Catalog::from_yaml(&text) {
        assert!(c.check().is_ok());
        let yaml = c.to_yaml().expect("serialize");
        assert_eq!(Catalog::from_yaml(&yaml).expect("reparse"), c);
    }
});
