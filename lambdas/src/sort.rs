//! MapReduce sort (the paper's §5.3): gensort-like 100-byte records, the `split`, `map` and
//! `reduce` lambdas, and the validator that proves an output is the sorted input.
//!
//! `split` cuts the job input into `mappers` slices of whole records (a `scatter` edge: one mapper
//! per slice); each `map` range-partitions its slice by key into `part-<j>` for the `reduce` stage
//! (a `shuffle` edge, `SONIC_FANOUT_REDUCE` parts) and sorts each part; reducer `j` sorts everything
//! it got and writes `result/part-<j>`. Partitions are ranges of the key's first 8 bytes, so the
//! concatenation `part-0`, `part-1`, ... is globally sorted.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sonic_lambda::{Context, LambdaError, RESULT};
use tracing::info;
use xxhash_rust::xxh3::xxh3_64;

use crate::rng::Rng;

/// Bytes in a record.
pub const RECORD: usize = 100;
/// Bytes of the key at the start of a record.
pub const KEY: usize = 10;
/// Default number of slices `split` writes.
pub const DEFAULT_MAPPERS: u32 = 4;

/// What can go wrong in the sort lambdas and the validator.
#[derive(Debug, thiserror::Error)]
pub enum SortError {
    #[error(transparent)]
    Lambda(#[from] LambdaError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {len} bytes is not a whole number of {RECORD}-byte records")]
    Ragged { path: PathBuf, len: u64 },
    #[error("parameter {name}: {reason}")]
    Param { name: &'static str, reason: String },
    #[error("no input files")]
    NoInput,
    #[error("not sorted: record {index} of {path} has a smaller key than the record before it")]
    NotSorted { path: PathBuf, index: u64 },
    #[error("the output is not a permutation of the input: input {input}, output {output}")]
    Mismatch { input: Checksum, output: Checksum },
    #[error("{path}: not a result part (expected part-<j>)")]
    BadPartName { path: PathBuf },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SortError + '_ {
    move |source| SortError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---- records and the generator ----

/// Fills `out` with record `index` of the data set of `rng`: a random 10-byte key, then a
/// gensort-like payload (marker bytes, the record number in hex, filler) that makes every record
/// unique and checkable.
fn make_record(rng: &mut Rng, index: u64, out: &mut [u8; RECORD]) {
    rng.fill(&mut out[..KEY]);
    out[10] = 0x00;
    out[11] = 0x11;
    let hex = format!("{index:032X}");
    out[12..44].copy_from_slice(hex.as_bytes());
    out[44..48].copy_from_slice(&[0x88, 0x99, 0xAA, 0xBB]);
    for (k, b) in out[48..96].iter_mut().enumerate() {
        // Twelve groups of four identical characters, from the record number's nibbles.
        let nibble = ((index >> ((k / 4 % 16) * 4)) & 0xF) as usize;
        *b = b"0123456789ABCDEF"[nibble];
    }
    out[96..100].copy_from_slice(&[0xCC, 0xDD, 0xEE, 0xFF]);
}

/// Writes `bytes / 100` records (the size rounded down to whole records) generated from `seed`.
/// Returns the number of bytes written.
pub fn generate(w: &mut impl Write, bytes: u64, seed: u64) -> io::Result<u64> {
    let records = bytes / RECORD as u64;
    let mut rng = Rng::new(seed);
    let mut rec = [0u8; RECORD];
    for i in 0..records {
        make_record(&mut rng, i, &mut rec);
        w.write_all(&rec)?;
    }
    Ok(records * RECORD as u64)
}

/// The key of a record.
pub fn key(record: &[u8]) -> &[u8] {
    &record[..KEY]
}

/// The reducer of a key among `parts`: ranges of the key's first 8 bytes (big-endian), so
/// partition order is key order.
pub fn partition(key: &[u8], parts: u32) -> u32 {
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&key[..8]);
    let p = u64::from_be_bytes(prefix);
    ((u128::from(p) * u128::from(parts)) >> 64) as u32
}

// ---- checksums and the validator ----

/// An order-independent fingerprint of a multiset of records: the count, and the wrapping sum and
/// the xor of the records' 64-bit hashes. A lost, duplicated or altered record changes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Checksum {
    pub records: u64,
    pub sum: u64,
    pub xor: u64,
}

impl Checksum {
    pub fn add(&mut self, record: &[u8]) {
        let h = xxh3_64(record);
        self.records += 1;
        self.sum = self.sum.wrapping_add(h);
        self.xor ^= h;
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} records, sum {:016x}, xor {:016x}",
            self.records, self.sum, self.xor
        )
    }
}

/// Reads the records of `files` in order, in blocks, calling `each(file, index in file, record)`.
fn for_each_record(
    files: &[PathBuf],
    mut each: impl FnMut(&Path, u64, &[u8]) -> Result<(), SortError>,
) -> Result<(), SortError> {
    let mut buf = vec![0u8; RECORD * 10_000];
    for path in files {
        let len = fs::metadata(path).map_err(io_err(path))?.len();
        if len % RECORD as u64 != 0 {
            return Err(SortError::Ragged {
                path: path.clone(),
                len,
            });
        }
        let mut f = File::open(path).map_err(io_err(path))?;
        let mut index = 0u64;
        let mut left = len;
        while left > 0 {
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            f.read_exact(&mut buf[..n]).map_err(io_err(path))?;
            for rec in buf[..n].chunks_exact(RECORD) {
                each(path, index, rec)?;
                index += 1;
            }
            left -= n as u64;
        }
    }
    Ok(())
}

/// The checksum of the records of `files`.
pub fn checksum_files(files: &[PathBuf]) -> Result<Checksum, SortError> {
    let mut c = Checksum::default();
    for_each_record(files, |_, _, rec| {
        c.add(rec);
        Ok(())
    })?;
    Ok(c)
}

/// What a successful validation saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Validation {
    pub records: u64,
    pub checksum: Checksum,
}

/// Checks that `outputs`, concatenated in order, are sorted by key and hold exactly the records of
/// `inputs` (same count, same multiset by checksum).
pub fn validate(inputs: &[PathBuf], outputs: &[PathBuf]) -> Result<Validation, SortError> {
    let input = checksum_files(inputs)?;
    let mut output = Checksum::default();
    let mut last: Option<[u8; KEY]> = None;
    for_each_record(outputs, |path, index, rec| {
        let mut k = [0u8; KEY];
        k.copy_from_slice(key(rec));
        if let Some(prev) = last
            && k < prev
        {
            return Err(SortError::NotSorted {
                path: path.to_path_buf(),
                index,
            });
        }
        last = Some(k);
        output.add(rec);
        Ok(())
    })?;
    if input != output {
        return Err(SortError::Mismatch { input, output });
    }
    Ok(Validation {
        records: output.records,
        checksum: output,
    })
}

/// The `part-<j>` files under `dir` (searched recursively), in reducer order.
pub fn result_parts(dir: &Path) -> Result<Vec<PathBuf>, SortError> {
    let mut parts = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).map_err(io_err(&d))? {
            let entry = entry.map_err(io_err(&d))?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            parts.push((part_index(&path)?, path));
        }
    }
    parts.sort();
    Ok(parts.into_iter().map(|(_, p)| p).collect())
}

/// `j` of a `.../part-<j>` path.
pub fn part_index(path: &Path) -> Result<u32, SortError> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("part-"))
        .and_then(|j| j.parse().ok())
        .ok_or_else(|| SortError::BadPartName {
            path: path.to_path_buf(),
        })
}

// ---- the lambdas ----

/// What `split` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SplitReport {
    pub records: u64,
    pub slices: u32,
}

/// `split`: cuts the input (every input file, in name order) into at most `mappers` slices of
/// whole records, `<to>/slice-<k>`, streaming. An empty input still gives one (empty) slice, so
/// the job runs to an empty result.
pub fn split(ctx: &Context, to: &str) -> Result<SplitReport, SortError> {
    let mappers: u32 = ctx.param_or("mappers", DEFAULT_MAPPERS)?;
    if mappers == 0 {
        return Err(SortError::Param {
            name: "mappers",
            reason: "must be at least 1".into(),
        });
    }
    let files: Vec<PathBuf> = crate::input_files(ctx)?
        .into_iter()
        .map(|f| f.path)
        .collect();
    if files.is_empty() {
        return Err(SortError::NoInput);
    }
    let mut total = 0u64;
    for path in &files {
        let len = fs::metadata(path).map_err(io_err(path))?.len();
        if len % RECORD as u64 != 0 {
            return Err(SortError::Ragged {
                path: path.clone(),
                len,
            });
        }
        total += len;
    }
    let records = total / RECORD as u64;
    let slices = u64::from(mappers).min(records).max(1);
    let mut reader = ChainReader::new(files);
    for s in 0..slices {
        // Balanced: the first `records % slices` slices get one record more.
        let n = records / slices + u64::from(s < records % slices);
        let name = format!("slice-{s:05}");
        let mut w = ctx.create_output(to, &name)?;
        let copied = io::copy(&mut (&mut reader).take(n * RECORD as u64), &mut w)
            .map_err(io_err(w.target()))?;
        if copied != n * RECORD as u64 {
            return Err(SortError::Io {
                path: w.target().to_path_buf(),
                source: io::Error::new(io::ErrorKind::UnexpectedEof, "input shrank while read"),
            });
        }
        w.commit()?;
    }
    let report = SplitReport {
        records,
        slices: slices as u32,
    };
    info!(records, slices, "split done");
    Ok(report)
}

/// Reads a list of files as one stream.
struct ChainReader {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(PathBuf, BufReader<File>)>,
}

impl ChainReader {
    fn new(files: Vec<PathBuf>) -> Self {
        Self {
            files: files.into_iter(),
            current: None,
        }
    }
}

impl Read for ChainReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some((_, r)) = self.current.as_mut() {
                let n = r.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                self.current = None;
            }
            match self.files.next() {
                None => return Ok(0),
                Some(path) => {
                    let f = File::open(&path).map_err(|e| {
                        io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?;
                    self.current = Some((path, BufReader::with_capacity(1 << 20, f)));
                }
            }
        }
    }
}

/// Reads every input file of this instance into memory, as whole records.
fn read_records(ctx: &Context) -> Result<Vec<u8>, SortError> {
    let files = crate::input_files(ctx)?;
    let mut data = Vec::new();
    for f in &files {
        let mut file = File::open(&f.path).map_err(io_err(&f.path))?;
        let len = file.metadata().map_err(io_err(&f.path))?.len();
        if len % RECORD as u64 != 0 {
            return Err(SortError::Ragged {
                path: f.path.clone(),
                len,
            });
        }
        data.try_reserve(usize::try_from(len).unwrap_or(usize::MAX))
            .map_err(|e| io_err(&f.path)(io::Error::other(e)))?;
        file.read_to_end(&mut data).map_err(io_err(&f.path))?;
    }
    Ok(data)
}

/// Writes records (in the given order) to an atomic output.
fn write_records(ctx: &Context, to: &str, name: &str, records: &[&[u8]]) -> Result<(), SortError> {
    let w = ctx.create_output(to, name)?;
    let target = w.target().to_path_buf();
    let mut w = BufWriter::with_capacity(1 << 20, w);
    for r in records {
        w.write_all(r).map_err(io_err(&target))?;
    }
    let w = w
        .into_inner()
        .map_err(|e| io_err(&target)(e.into_error()))?;
    w.commit()?;
    Ok(())
}

/// What `map` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapReport {
    pub records: u64,
    pub parts: Vec<u64>,
}

/// `map`: partitions its records by key range into `<to>/part-<j>`, one per reducer (the shuffle
/// fanout `SONIC_FANOUT_<TO>`, else the `reducers` parameter), each part sorted (the map-side sort
/// of Hadoop), every part written even when empty.
pub fn map(ctx: &Context, to: &str) -> Result<MapReport, SortError> {
    let parts = match ctx.fanout(to) {
        Ok(n) => n,
        Err(LambdaError::MissingFanout { .. }) => ctx.param_or("reducers", 1u32)?,
        Err(e) => return Err(e.into()),
    };
    if parts == 0 {
        return Err(SortError::Param {
            name: "reducers",
            reason: "must be at least 1".into(),
        });
    }
    let data = read_records(ctx)?;
    let mut buckets: Vec<Vec<&[u8]>> = vec![Vec::new(); parts as usize];
    for rec in data.chunks_exact(RECORD) {
        buckets[partition(key(rec), parts) as usize].push(rec);
    }
    let mut sizes = Vec::with_capacity(buckets.len());
    for (j, mut bucket) in buckets.into_iter().enumerate() {
        bucket.sort_unstable();
        sizes.push(bucket.len() as u64);
        write_records(ctx, to, &sonic_lambda::part_name(j as u32), &bucket)?;
    }
    let records = (data.len() / RECORD) as u64;
    info!(records, parts, "map done");
    Ok(MapReport {
        records,
        parts: sizes,
    })
}

/// `reduce`: sorts every record it received (the parts for its key range from every mapper) and
/// writes `result/part-<instance>`.
pub fn reduce(ctx: &Context) -> Result<u64, SortError> {
    let data = read_records(ctx)?;
    let mut records: Vec<&[u8]> = data.chunks_exact(RECORD).collect();
    // Whole-record order: key order, with ties broken deterministically.
    records.sort_unstable();
    let name = sonic_lambda::part_name(ctx.instance);
    write_records(ctx, RESULT, &name, &records)?;
    let n = records.len() as u64;
    info!(records = n, part = ctx.instance, "reduce done");
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::write(path, bytes).unwrap();
    }

    fn data(bytes: u64, seed: u64) -> Vec<u8> {
        let mut v = Vec::new();
        generate(&mut v, bytes, seed).unwrap();
        v
    }

    #[test]
    fn generator_is_deterministic_and_whole_records() {
        let a = data(1_050, 3);
        assert_eq!(a.len(), 1_000);
        assert_eq!(a, data(1_050, 3));
        assert_ne!(a, data(1_050, 4));
        // The payload carries the record number.
        assert_eq!(&a[112..144], format!("{:032X}", 1).as_bytes());
    }

    #[test]
    fn partitions_are_key_ranges() {
        let check = |k: [u8; 10], parts, expect| assert_eq!(partition(&k, parts), expect);
        check([0; 10], 4, 0);
        check([0xFF; 10], 4, 3);
        check([0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0], 4, 1);
        check([0x3F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 9, 9], 4, 0);
        check([0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0], 1, 0);
        let recs = data(100_000, 1);
        let mut last = 0;
        let mut keys: Vec<&[u8]> = recs.chunks_exact(RECORD).map(key).collect();
        keys.sort_unstable();
        for k in keys {
            let p = partition(k, 7);
            assert!(p >= last && p < 7);
            last = p;
        }
    }

    #[test]
    fn validator_accepts_sorted_permutations_only() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let recs = data(20_000, 9);
        write(&input, &recs);
        let mut sorted: Vec<&[u8]> = recs.chunks_exact(RECORD).collect();
        sorted.sort_unstable();
        let (a, b) = sorted.split_at(77);
        let (pa, pb) = (dir.path().join("part-0"), dir.path().join("part-1"));
        write(&pa, &a.concat());
        write(&pb, &b.concat());
        let v = validate(std::slice::from_ref(&input), &[pa.clone(), pb.clone()]).unwrap();
        assert_eq!(v.records, 200);

        // Wrong order of the parts: not sorted.
        let err = validate(std::slice::from_ref(&input), &[pb.clone(), pa.clone()]).unwrap_err();
        assert!(matches!(err, SortError::NotSorted { .. }), "{err}");

        // A record duplicated in place of another: sorted, same count, different checksum.
        let mut dup = b.to_vec();
        dup[1] = dup[0];
        write(&pb, &dup.concat());
        let err = validate(std::slice::from_ref(&input), &[pa.clone(), pb.clone()]).unwrap_err();
        assert!(matches!(err, SortError::Mismatch { .. }), "{err}");

        // One payload byte changed.
        let mut changed = b.concat();
        changed[50] ^= 1;
        write(&pb, &changed);
        assert!(validate(std::slice::from_ref(&input), &[pa.clone(), pb.clone()]).is_err());

        // A torn record.
        write(&pb, &b.concat()[..150]);
        let err = validate(std::slice::from_ref(&input), &[pa, pb]).unwrap_err();
        assert!(matches!(err, SortError::Ragged { .. }), "{err}");
    }

    #[test]
    fn result_parts_are_in_reducer_order() {
        let dir = tempfile::tempdir().unwrap();
        for j in [10, 2, 0] {
            let sub = dir.path().join(format!("reduce/{j}"));
            fs::create_dir_all(&sub).unwrap();
            write(&sub.join(format!("part-{j}")), b"");
        }
        let names: Vec<u32> = result_parts(dir.path())
            .unwrap()
            .iter()
            .map(|p| part_index(p).unwrap())
            .collect();
        assert_eq!(names, [0, 2, 10]);
        write(&dir.path().join("junk"), b"");
        assert!(result_parts(dir.path()).is_err());
    }
}
