//! Alias bombs ("billion laughs"), deep nesting and floods of nodes are refused after bounded
//! memory: a counting allocator measures the peak heap each parse reaches. One test in this binary,
//! so no other thread allocates while it measures.

// A global allocator is an `unsafe impl`; it only forwards to the system allocator and counts.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use sonic_core::catalog::Catalog;
use sonic_core::dag::Dag;
use sonic_core::params::Params;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments; the counters do not touch
// the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grow = new_size - layout.size();
                let live = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes `f` holds at its peak beyond what was live before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(before))
}

/// What any one parse of a hostile file may hold: far below what an expansion would need.
const CEILING: usize = 64 * 1024 * 1024;

/// Ten levels of ten aliases each, under `key`: 10^10 leaves if expanded.
fn laughs(key: &str) -> String {
    let mut s = format!("{key}:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*l{}", i - 1); 10].join(", ");
        s += &format!("  l{i}: &l{i} [{refs}]\n");
    }
    s
}

#[test]
fn hostile_yaml_is_refused_within_bounded_memory() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bad-dags");
    let mut worst = (String::new(), 0usize);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("corpus")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(names.iter().any(|n| n.starts_with("billion-laughs")));
    for name in &names {
        let bytes = std::fs::read(dir.join(name)).expect("read");
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (result, peak) = peak_of(|| Dag::from_yaml(name, &text).map(|_| ()));
        assert!(result.is_err(), "{name} accepted");
        assert!(peak < CEILING, "{name}: {peak} bytes at the peak");
        if peak > worst.1 {
            worst = (name.clone(), peak);
        }
    }

    // Bigger bombs than the corpus holds, in each YAML reader.
    let functions = "functions:\n  - { name: a, image: img, command: [run] }\n";
    let bombs: Vec<(&str, String)> = vec![
        (
            "dag params",
            format!("name: t\n{}{functions}", laughs("params")),
        ),
        ("params file", laughs("functions")),
        ("catalog", laughs("vm_types")),
        (
            "wide anchor",
            format!(
                "name: t\nparams:\n  big: &big [{}]\n  copies: [{}]\n{functions}",
                vec!["x"; 50_000].join(", "),
                vec!["*big"; 5_000].join(", ")
            ),
        ),
        (
            "deep flow nesting",
            format!(
                "name: t\nparams:\n  deep: {}{}\n{functions}",
                "[".repeat(200_000),
                "]".repeat(200_000)
            ),
        ),
    ];
    for (what, text) in &bombs {
        let (refused, peak) = peak_of(|| match *what {
            "params file" => Params::from_yaml(text).is_err(),
            "catalog" => Catalog::from_yaml(text).is_err(),
            _ => Dag::from_yaml("bomb.yaml", text).is_err(),
        });
        assert!(refused, "{what} accepted");
        assert!(peak < CEILING, "{what}: {peak} bytes at the peak");
        if peak > worst.1 {
            worst = ((*what).to_owned(), peak);
        }
    }
    println!("largest peak: {} bytes ({})", worst.1, worst.0);
}
