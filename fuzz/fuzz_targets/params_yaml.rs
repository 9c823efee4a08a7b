//! `Params::from_yaml` on any bytes: never a panic; accepted parameters check and round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sonic_core::params::Params;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(p) = Params::from_yaml(&text) {
        assert!(p.check().is_ok());
        let yaml = p.to_yaml().expect("serialize");
        assert_eq!(Params::from_yaml(&yaml).expect("reparse"), p);
    }
});
