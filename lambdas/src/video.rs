//! Video analytics (the paper's §5.3 and Fig. 1): `split` cuts a video into fixed-length chunks,
//! `extract` picks a representative frame of each chunk, `classify` classifies each frame and
//! writes the chunk's label to the job's results (long-term storage).
//!
//! Videos are Y4M (see [`crate::y4m`]). The generator draws scenes of five classes of synthetic
//! shapes (a disc, a box, a diamond, horizontal and vertical stripes) in random colours, moving,
//! with sensor noise; the class changes with every scene. The classifier is a softmax regression
//! on gradient-orientation features of the luma plane, trained by [`train`] on generated frames;
//! its weights ship in `lambdas/models/video-classifier.json`, embedded in the binary.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sonic_lambda::{Context, LambdaError, RESULT};
use tracing::info;

use crate::rng::Rng;
use crate::y4m::{self, Header, Y4mError};

/// The scene classes, by label.
pub const CLASSES: [&str; 5] = ["disc", "box", "diamond", "hstripes", "vstripes"];
/// The frame each `extract` instance sends its `classify` (a one-frame Y4M stream).
pub const FRAME_FILE: &str = "frame.y4m";
/// Where that frame comes from ([`FrameInfo`]), sent beside it.
pub const FRAME_INFO_FILE: &str = "frame.json";
/// Each `classify` instance writes `result/<LABEL_PREFIX><chunk>.json` ([`label_file`]).
pub const LABEL_PREFIX: &str = "label-";
/// The default chunk length (the paper uses 10 s chunks).
pub const DEFAULT_CHUNK_SECONDS: f64 = 10.0;
/// The weights the project trained (`sonic-gen train-video-model`).
pub const EMBEDDED_MODEL: &str = include_str!("../models/video-classifier.json");

/// What can go wrong in the video lambdas.
#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    #[error(transparent)]
    Lambda(#[from] LambdaError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Y4m {
        path: PathBuf,
        #[source]
        source: Y4mError,
    },
    #[error("parameter {name}: {reason}")]
    Param { name: &'static str, reason: String },
    #[error("{0}: the video has no frames")]
    NoFrames(PathBuf),
    #[error("no input video")]
    NoInput,
    #[error("classifier model: {0}")]
    Model(String),
    #[error("labels: {0}")]
    Labels(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> VideoError + '_ {
    move |source| VideoError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn y4m_err(path: &Path) -> impl FnOnce(Y4mError) -> VideoError + '_ {
    move |source| VideoError::Y4m {
        path: path.to_path_buf(),
        source,
    }
}

// ---- the generator ----

/// The shape of a generated video.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VideoSpec {
    pub width: usize,
    pub height: usize,
    pub fps: u32,
    pub seconds: u32,
    /// The class changes every `scene_seconds`.
    pub scene_seconds: u32,
    pub seed: u64,
}

impl Default for VideoSpec {
    fn default() -> Self {
        Self {
            width: 64,
            height: 48,
            fps: 10,
            seconds: 30,
            scene_seconds: 10,
            seed: 1,
        }
    }
}

impl VideoSpec {
    pub fn header(&self) -> Header {
        Header::new(self.width, self.height, self.fps, 1)
    }

    pub fn frames(&self) -> u64 {
        u64::from(self.seconds) * u64::from(self.fps)
    }

    fn frames_per_scene(&self) -> u64 {
        (u64::from(self.scene_seconds) * u64::from(self.fps)).max(1)
    }

    /// The class shown in frame `f`.
    pub fn class_at(&self, f: u64) -> usize {
        let scene = f / self.frames_per_scene();
        Scene::random(&mut Rng::derive(self.seed, scene), self.width, self.height).class
    }

    /// The true label of each chunk of `chunk_seconds`: the class of its representative frame.
    pub fn chunk_truth(&self, chunk_seconds: f64) -> Vec<usize> {
        let fpc = frames_per_chunk(&self.header(), chunk_seconds);
        let total = self.frames();
        (0..total.div_ceil(fpc))
            .map(|k| {
                let start = k * fpc;
                let len = fpc.min(total - start);
                self.class_at(start + len / 2)
            })
            .collect()
    }
}

/// One scene: a class, colours, and the motion of its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Scene {
    pub class: usize,
    bg: [u8; 3],
    fg: [u8; 3],
    /// Radius, half-width, or stripe period, by class.
    a: f64,
    /// Half-height of a box.
    b: f64,
    x0: f64,
    y0: f64,
    vx: f64,
    vy: f64,
}

/// Reflects `p` into `[lo, hi]` (a triangle wave), so shapes bounce off the borders.
fn bounce(p: f64, lo: f64, hi: f64) -> f64 {
    let span = hi - lo;
    if span <= 0.0 {
        return (lo + hi) / 2.0;
    }
    let t = (p - lo).rem_euclid(2.0 * span);
    lo + if t < span { t } else { 2.0 * span - t }
}

impl Scene {
    /// A random scene for a `w` x `h` frame; shapes scale with the frame.
    pub fn random(rng: &mut Rng, w: usize, h: usize) -> Scene {
        let class = rng.below(CLASSES.len() as u64) as usize;
        let s = w.min(h) as f64 / 48.0;
        let bg_y = rng.range_f64(30.0, 225.0);
        // The shape differs from the background by 50 to 100 in luma, whichever way fits.
        let delta = rng.range_f64(50.0, 100.0);
        let fg_y = if bg_y + delta <= 235.0 && (bg_y - delta < 16.0 || rng.unit() < 0.5) {
            bg_y + delta
        } else {
            bg_y - delta
        };
        let mut chroma = || rng.range_f64(64.0, 192.0) as u8;
        let bg = [bg_y as u8, chroma(), chroma()];
        let fg = [fg_y.clamp(0.0, 255.0) as u8, chroma(), chroma()];
        let (a, b) = match class {
            0 => (rng.range_f64(7.0, 15.0) * s, 0.0),
            1 => (rng.range_f64(6.0, 15.0) * s, rng.range_f64(6.0, 15.0) * s),
            2 => (rng.range_f64(9.0, 18.0) * s, 0.0),
            _ => (rng.range_f64(6.0, 14.0) * s, 0.0),
        };
        Scene {
            class,
            bg,
            fg,
            a,
            b,
            x0: rng.range_f64(0.0, w as f64),
            y0: rng.range_f64(0.0, h as f64),
            vx: rng.range_f64(-0.4, 0.4) * s,
            vy: rng.range_f64(-0.4, 0.4) * s,
        }
    }

    /// Whether the pixel centred at `(x, y)` of frame `f` shows the shape.
    fn covers(&self, x: f64, y: f64, f: u64, w: usize, h: usize) -> bool {
        let t = f as f64;
        let (w, h) = (w as f64, h as f64);
        let ext = self.a.max(self.b);
        let cx = bounce(
            self.x0 + self.vx * t,
            ext.min(w / 2.0),
            w - ext.min(w / 2.0),
        );
        let cy = bounce(
            self.y0 + self.vy * t,
            ext.min(h / 2.0),
            h - ext.min(h / 2.0),
        );
        let (dx, dy) = (x - cx, y - cy);
        match self.class {
            0 => dx * dx + dy * dy <= self.a * self.a,
            1 => dx.abs() <= self.a && dy.abs() <= self.b,
            2 => dx.abs() + dy.abs() <= self.a,
            // Stripes scroll across the frame at the scene's speed.
            3 => ((y + self.y0 + self.vy * t * 2.0) / (self.a / 2.0)).floor() as i64 % 2 == 0,
            _ => ((x + self.x0 + self.vx * t * 2.0) / (self.a / 2.0)).floor() as i64 % 2 == 0,
        }
    }

    /// Frame `f` of the scene (planes of `header`), with luma noise from `noise`.
    pub fn render(&self, f: u64, header: &Header, noise: &mut Rng, out: &mut Vec<u8>) {
        let (w, h) = (header.width, header.height);
        out.clear();
        for py in 0..h {
            for px in 0..w {
                let on = self.covers(px as f64 + 0.5, py as f64 + 0.5, f, w, h);
                let base = if on { self.fg[0] } else { self.bg[0] };
                let n = noise.below(13) as i32 - 6;
                out.push((i32::from(base) + n).clamp(0, 255) as u8);
            }
        }
        let (cw, ch) = header.chroma_size();
        for plane in 1..3 {
            for cy in 0..ch {
                for cx in 0..cw {
                    // The centre of the luma pixels this chroma sample covers.
                    let x = (cx * w) as f64 / cw as f64 + w as f64 / cw as f64 / 2.0;
                    let y = (cy * h) as f64 / ch as f64 + h as f64 / ch as f64 / 2.0;
                    let on = self.covers(x, y, f, w, h);
                    out.push(if on { self.fg[plane] } else { self.bg[plane] });
                }
            }
        }
    }
}

/// The ground truth of a generated video: the class of every scene.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truth {
    pub fps: u32,
    pub scene_seconds: u32,
    pub frames: u64,
    pub scenes: Vec<usize>,
}

impl Truth {
    /// The class shown in frame `f` of the video.
    pub fn class_at(&self, f: u64) -> Option<usize> {
        let per_scene = (u64::from(self.scene_seconds) * u64::from(self.fps)).max(1);
        self.scenes
            .get(usize::try_from(f / per_scene).ok()?)
            .copied()
    }

    /// `(right, total)`: chunks whose label is the class of the frame they classified.
    pub fn score(&self, labels: &Labels) -> (usize, usize) {
        let right = labels
            .labels
            .iter()
            .filter(|l| {
                let start = (l.start_s * f64::from(self.fps)).round() as u64;
                self.class_at(start + l.frame) == Some(l.label)
            })
            .count();
        (right, labels.labels.len())
    }
}

/// Writes the video of `spec`; returns the class of each scene.
pub fn generate(w: impl Write, spec: &VideoSpec) -> io::Result<Truth> {
    if spec.width < 8 || spec.height < 8 || spec.fps == 0 || spec.scene_seconds == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "need at least 8x8 pixels, 1 fps and 1 s scenes",
        ));
    }
    let header = spec.header();
    let mut out = y4m::Writer::new(BufWriter::with_capacity(1 << 20, w), &header)?;
    let per_scene = spec.frames_per_scene();
    let mut scenes = Vec::new();
    let mut frame = Vec::with_capacity(header.frame_bytes());
    let mut scene: Option<Scene> = None;
    for f in 0..spec.frames() {
        if f % per_scene == 0 {
            let s = Scene::random(
                &mut Rng::derive(spec.seed, f / per_scene),
                spec.width,
                spec.height,
            );
            scenes.push(s.class);
            scene = Some(s);
        }
        if let Some(s) = &scene {
            let mut noise = Rng::derive(spec.seed ^ 0xF00D, f);
            s.render(f % per_scene, &header, &mut noise, &mut frame);
            out.write_frame(&frame)?;
        }
    }
    out.into_inner().flush()?;
    Ok(Truth {
        fps: spec.fps,
        scene_seconds: spec.scene_seconds,
        frames: spec.frames(),
        scenes,
    })
}

// ---- features and the classifier ----

/// Names of the features, in order.
pub const FEATURE_NAMES: [&str; 12] = [
    "orient0",
    "orient22",
    "orient45",
    "orient67",
    "orient90",
    "orient112",
    "orient135",
    "orient157",
    "edge_fraction",
    "coherence2",
    "coherence4",
    "cos4",
];
pub const FEATURES: usize = FEATURE_NAMES.len();
/// Sobel magnitude below which a pixel is not an edge: a 50-level step gives 200, noise < 50.
const EDGE_THRESHOLD: f64 = 60.0;

/// Features of a luma plane: a magnitude-weighted histogram of gradient orientations (8 bins over
/// 0..180 degrees, soft-assigned, normalised), the fraction of edge pixels, and how strongly the
/// orientations follow a 2-fold (stripes) or 4-fold (box, diamond) symmetry.
pub fn features(luma: &[u8], w: usize, h: usize) -> [f64; FEATURES] {
    let mut out = [0.0; FEATURES];
    if w < 3 || h < 3 || luma.len() < w * h {
        return out;
    }
    let p = |x: usize, y: usize| f64::from(luma[y * w + x]);
    let (mut total, mut edges) = (0.0, 0usize);
    let (mut c2, mut s2, mut c4, mut s4) = (0.0, 0.0, 0.0, 0.0);
    let mut hist = [0.0f64; 8];
    for y in 1..h - 1 {
        for x in 1..w - 1 {
            let gx = p(x + 1, y - 1) + 2.0 * p(x + 1, y) + p(x + 1, y + 1)
                - p(x - 1, y - 1)
                - 2.0 * p(x - 1, y)
                - p(x - 1, y + 1);
            let gy = p(x - 1, y + 1) + 2.0 * p(x, y + 1) + p(x + 1, y + 1)
                - p(x - 1, y - 1)
                - 2.0 * p(x, y - 1)
                - p(x + 1, y - 1);
            let m = (gx * gx + gy * gy).sqrt();
            if m < EDGE_THRESHOLD {
                continue;
            }
            edges += 1;
            total += m;
            let theta = gy.atan2(gx).rem_euclid(std::f64::consts::PI);
            let pos = theta / std::f64::consts::PI * 8.0;
            let lo = pos.floor() as usize % 8;
            let frac = pos - pos.floor();
            hist[lo] += m * (1.0 - frac);
            hist[(lo + 1) % 8] += m * frac;
            c2 += m * (2.0 * theta).cos();
            s2 += m * (2.0 * theta).sin();
            c4 += m * (4.0 * theta).cos();
            s4 += m * (4.0 * theta).sin();
        }
    }
    if total > 0.0 {
        for (o, v) in out.iter_mut().zip(hist) {
            *o = v / total;
        }
        out[9] = (c2 * c2 + s2 * s2).sqrt() / total;
        out[10] = (c4 * c4 + s4 * s4).sqrt() / total;
        out[11] = c4 / total;
    }
    out[8] = edges as f64 / ((w - 2) * (h - 2)) as f64;
    out
}

/// How the shipped model was trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingInfo {
    pub frames: usize,
    pub seed: u64,
    pub iterations: usize,
    pub width: usize,
    pub height: usize,
    pub train_accuracy: f64,
    pub holdout_frames: usize,
    pub holdout_accuracy: f64,
}

/// A softmax regression on standardised [`features`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Classifier {
    pub kind: String,
    pub classes: Vec<String>,
    pub features: Vec<String>,
    pub mean: Vec<f64>,
    pub scale: Vec<f64>,
    /// One row per class.
    pub weights: Vec<Vec<f64>>,
    pub bias: Vec<f64>,
    pub training: TrainingInfo,
}

impl Classifier {
    /// The model embedded in the binary.
    pub fn embedded() -> Result<Classifier, VideoError> {
        Self::from_json(EMBEDDED_MODEL)
    }

    pub fn from_json(text: &str) -> Result<Classifier, VideoError> {
        let c: Classifier =
            serde_json::from_str(text).map_err(|e| VideoError::Model(e.to_string()))?;
        let nf = c.features.len();
        let ok = c.classes.len() >= 2
            && c.mean.len() == nf
            && c.scale.len() == nf
            && c.weights.len() == c.classes.len()
            && c.weights.iter().all(|r| r.len() == nf)
            && c.bias.len() == c.classes.len()
            && nf == FEATURES;
        if !ok {
            return Err(VideoError::Model(format!(
                "inconsistent shapes ({} classes, {nf} features; this build computes {FEATURES})",
                c.classes.len()
            )));
        }
        Ok(c)
    }

    /// Class probabilities of a feature vector.
    pub fn probabilities(&self, f: &[f64]) -> Vec<f64> {
        let z: Vec<f64> = f
            .iter()
            .zip(self.mean.iter().zip(&self.scale))
            .map(|(v, (m, s))| (v - m) / s)
            .collect();
        let logits: Vec<f64> = self
            .weights
            .iter()
            .zip(&self.bias)
            .map(|(w, b)| w.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>() + b)
            .collect();
        softmax(&logits)
    }

    /// The most likely class and its probability.
    pub fn classify(&self, f: &[f64]) -> (usize, f64) {
        let p = self.probabilities(f);
        p.iter().copied().enumerate().fold(
            (0, f64::MIN),
            |best, (i, v)| if v > best.1 { (i, v) } else { best },
        )
    }
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::MIN, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

/// Labelled feature vectors of `n` random frames (each from its own random scene, at a random
/// point of a 10 s scene), from `seed`.
pub fn sample_frames(n: usize, seed: u64, w: usize, h: usize) -> Vec<([f64; FEATURES], usize)> {
    let header = Header::new(w, h, 10, 1);
    let mut buf = Vec::new();
    (0..n)
        .map(|i| {
            let mut rng = Rng::derive(seed, i as u64);
            let scene = Scene::random(&mut rng, w, h);
            let f = rng.below(100);
            scene.render(f, &header, &mut rng, &mut buf);
            (features(&buf[..w * h], w, h), scene.class)
        })
        .collect()
}

/// The fraction of samples a classifier gets right.
pub fn sample_accuracy(c: &Classifier, samples: &[([f64; FEATURES], usize)]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let right = samples
        .iter()
        .filter(|(f, label)| c.classify(f).0 == *label)
        .count();
    right as f64 / samples.len() as f64
}

/// Trains the classifier: full-batch gradient descent with momentum on the softmax
/// cross-entropy (L2 1e-4), `frames` training frames from `seed` and as many held-out frames
/// from another seed. Deterministic.
pub fn train(frames: usize, seed: u64, iterations: usize) -> Classifier {
    let (w, h) = (64, 48);
    let train_set = sample_frames(frames, seed, w, h);
    let n = train_set.len().max(1) as f64;
    let mut mean = [0.0; FEATURES];
    let mut scale = [0.0; FEATURES];
    for (f, _) in &train_set {
        for k in 0..FEATURES {
            mean[k] += f[k] / n;
        }
    }
    for (f, _) in &train_set {
        for k in 0..FEATURES {
            scale[k] += (f[k] - mean[k]).powi(2) / n;
        }
    }
    let scale: Vec<f64> = scale
        .iter()
        .map(|v| if v.sqrt() > 1e-9 { v.sqrt() } else { 1.0 })
        .collect();
    let z: Vec<([f64; FEATURES], usize)> = train_set
        .iter()
        .map(|(f, c)| (std::array::from_fn(|k| (f[k] - mean[k]) / scale[k]), *c))
        .collect();
    let nc = CLASSES.len();
    let mut wt = vec![[0.0f64; FEATURES]; nc];
    let mut b = vec![0.0f64; nc];
    let mut vw = vec![[0.0f64; FEATURES]; nc];
    let mut vb = vec![0.0f64; nc];
    let (lr, momentum, l2) = (0.5, 0.9, 1e-4);
    for _ in 0..iterations {
        let mut gw = vec![[0.0f64; FEATURES]; nc];
        let mut gb = vec![0.0f64; nc];
        for (x, c) in &z {
            let logits: Vec<f64> = (0..nc)
                .map(|k| wt[k].iter().zip(x).map(|(a, b)| a * b).sum::<f64>() + b[k])
                .collect();
            let p = softmax(&logits);
            for k in 0..nc {
                let d = p[k] - if k == *c { 1.0 } else { 0.0 };
                for j in 0..FEATURES {
                    gw[k][j] += d * x[j] / n;
                }
                gb[k] += d / n;
            }
        }
        for k in 0..nc {
            for j in 0..FEATURES {
                vw[k][j] = momentum * vw[k][j] - lr * (gw[k][j] + l2 * wt[k][j]);
                wt[k][j] += vw[k][j];
            }
            vb[k] = momentum * vb[k] - lr * gb[k];
            b[k] += vb[k];
        }
    }
    let mut c = Classifier {
        kind: "softmax-regression".into(),
        classes: CLASSES.iter().map(|s| s.to_string()).collect(),
        features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
        mean: mean.to_vec(),
        scale,
        weights: wt.iter().map(|r| r.to_vec()).collect(),
        bias: b,
        training: TrainingInfo {
            frames,
            seed,
            iterations,
            width: w,
            height: h,
            train_accuracy: 0.0,
            holdout_frames: frames,
            holdout_accuracy: 0.0,
        },
    };
    c.training.train_accuracy = sample_accuracy(&c, &train_set);
    let holdout = sample_frames(frames, seed ^ 0x4011_D0B7, w, h);
    c.training.holdout_accuracy = sample_accuracy(&c, &holdout);
    c
}

// ---- the lambdas ----

/// Frames in a chunk of `seconds` at the header's rate (at least 1).
pub fn frames_per_chunk(header: &Header, seconds: f64) -> u64 {
    ((seconds * header.fps()).round() as u64).max(1)
}

fn chunk_seconds(ctx: &Context) -> Result<f64, VideoError> {
    let s: f64 = ctx.param_or("chunk_seconds", DEFAULT_CHUNK_SECONDS)?;
    if !(s.is_finite() && s > 0.0) {
        return Err(VideoError::Param {
            name: "chunk_seconds",
            reason: format!("{s} is not a positive number of seconds"),
        });
    }
    Ok(s)
}

fn first_input(ctx: &Context) -> Result<PathBuf, VideoError> {
    crate::input_files(ctx)?
        .into_iter()
        .next()
        .map(|f| f.path)
        .ok_or(VideoError::NoInput)
}

/// `split`: cuts the video into chunks of `chunk_seconds` (`<to>/chunk-<k>.y4m`, each a complete
/// Y4M stream with the input's header), streaming; returns the number of chunks,
/// `ceil(duration / chunk_seconds)`.
pub fn split_stage(ctx: &Context, to: &str) -> Result<u64, VideoError> {
    let seconds = chunk_seconds(ctx)?;
    let path = first_input(ctx)?;
    let file = File::open(&path).map_err(io_err(&path))?;
    let mut reader =
        y4m::Reader::new(BufReader::with_capacity(1 << 20, file)).map_err(y4m_err(&path))?;
    let header = reader.header().clone();
    let fpc = frames_per_chunk(&header, seconds);
    let mut frame = Vec::with_capacity(header.frame_bytes());
    let mut chunks = 0u64;
    let mut current: Option<(ChunkWriter, PathBuf)> = None;
    while reader.read_frame(&mut frame).map_err(y4m_err(&path))? {
        let index = reader.frames_read() - 1;
        if index % fpc == 0 {
            if let Some((w, target)) = current.take() {
                finish_chunk(w, &target)?;
            }
            let out = ctx.create_output(to, &format!("chunk-{chunks:05}.y4m"))?;
            let target = out.target().to_path_buf();
            let w = y4m::Writer::new(BufWriter::with_capacity(1 << 16, out), &header)
                .map_err(io_err(&target))?;
            current = Some((w, target));
            chunks += 1;
        }
        if let Some((w, target)) = current.as_mut() {
            w.write_frame(&frame).map_err(io_err(target))?;
        }
    }
    match current {
        Some((w, target)) => finish_chunk(w, &target)?,
        None => return Err(VideoError::NoFrames(path)),
    }
    info!(
        frames = reader.frames_read(),
        chunks,
        frames_per_chunk = fpc,
        "split done"
    );
    Ok(chunks)
}

type ChunkWriter = y4m::Writer<BufWriter<sonic_lambda::AtomicWriter>>;

/// Flushes a chunk and renames it into place.
fn finish_chunk(w: ChunkWriter, target: &Path) -> Result<(), VideoError> {
    let out = w
        .into_inner()
        .into_inner()
        .map_err(|e| io_err(target)(e.into_error()))?;
    out.commit()?;
    Ok(())
}

/// What `extract` sends `classify` beside the frame: where the frame comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameInfo {
    pub chunk: u32,
    pub start_s: f64,
    /// Frames in the chunk.
    pub frames: u64,
    /// The representative frame, within the chunk.
    pub frame: u64,
}

/// One chunk's label, what `classify` writes as `result/label-<chunk>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkLabel {
    pub chunk: u32,
    pub start_s: f64,
    pub frames: u64,
    /// The representative frame, within the chunk.
    pub frame: u64,
    pub label: usize,
    pub class: String,
    pub confidence: f64,
}

/// The result file of chunk `k`: `label-<k, 5 digits>.json`, so that names sort in chunk order.
pub fn label_file(chunk: u32) -> String {
    format!("{LABEL_PREFIX}{chunk:05}.json")
}

/// The index of the representative frame: the middle one, or (`max-variance`) the one whose luma
/// varies most, which skips blank frames in real footage.
fn pick_frame(frames: &[Vec<u8>], luma: usize, how: &str) -> Result<usize, VideoError> {
    match how {
        "middle" => Ok(frames.len() / 2),
        "max-variance" => {
            let var = |f: &Vec<u8>| {
                let n = luma as f64;
                let mean = f[..luma].iter().map(|&v| f64::from(v)).sum::<f64>() / n;
                f[..luma]
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / n
            };
            Ok(frames
                .iter()
                .enumerate()
                .fold((0, f64::MIN), |best, (i, f)| {
                    let v = var(f);
                    if v > best.1 { (i, v) } else { best }
                })
                .0)
        }
        other => Err(VideoError::Param {
            name: "frame",
            reason: format!("{other:?} is not middle or max-variance"),
        }),
    }
}

/// `extract`: picks the representative frame of its chunk (`frame` parameter: `middle`, the
/// default, or `max-variance`) and sends it to `<to>` as `frame.y4m` (a one-frame Y4M stream
/// with the chunk's header: an image ffmpeg reads), with `frame.json` ([`FrameInfo`]). The chunk
/// index is the instance index (scatter order).
pub fn extract_stage(ctx: &Context, to: &str) -> Result<FrameInfo, VideoError> {
    let seconds = chunk_seconds(ctx)?;
    let how: String = ctx.param_or("frame", "middle".to_string())?;
    let path = first_input(ctx)?;
    let file = File::open(&path).map_err(io_err(&path))?;
    let mut reader = y4m::Reader::new(BufReader::new(file)).map_err(y4m_err(&path))?;
    let header = reader.header().clone();
    let mut frames = Vec::new();
    let mut buf = Vec::new();
    while reader.read_frame(&mut buf).map_err(y4m_err(&path))? {
        frames.push(std::mem::take(&mut buf));
    }
    if frames.is_empty() {
        return Err(VideoError::NoFrames(path));
    }
    let luma = header.width * header.height;
    let pick = pick_frame(&frames, luma, &how)?;
    let fpc = frames_per_chunk(&header, seconds);
    let info = FrameInfo {
        chunk: ctx.instance,
        start_s: (u64::from(ctx.instance) * fpc) as f64 / header.fps(),
        frames: frames.len() as u64,
        frame: pick as u64,
    };
    let out = ctx.create_output(to, FRAME_FILE)?;
    let target = out.target().to_path_buf();
    let mut w = y4m::Writer::new(BufWriter::new(out), &header).map_err(io_err(&target))?;
    w.write_frame(&frames[pick]).map_err(io_err(&target))?;
    finish_chunk(w, &target)?;
    let json = serde_json::to_vec(&info).map_err(|e| VideoError::Labels(e.to_string()))?;
    ctx.write_output(to, FRAME_INFO_FILE, &json)?;
    info!(
        chunk = info.chunk,
        frames = info.frames,
        frame = info.frame,
        "extract done"
    );
    Ok(info)
}

/// `classify`: classifies the frame its `extract` sent (the `one` edge pairs instance i with
/// instance i) with the embedded model and writes the chunk's label as
/// `result/label-<chunk>.json`: every chunk's label goes to long-term storage, as in the paper.
pub fn classify_stage(ctx: &Context) -> Result<ChunkLabel, VideoError> {
    let model = Classifier::embedded()?;
    let files = crate::input_files(ctx)?;
    let find = |name: &str| {
        files
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.path.clone())
            .ok_or_else(|| VideoError::Labels(format!("no {name} received")))
    };
    let (frame_path, info_path) = (find(FRAME_FILE)?, find(FRAME_INFO_FILE)?);
    let bytes = fs::read(&info_path).map_err(io_err(&info_path))?;
    let info: FrameInfo = serde_json::from_slice(&bytes)
        .map_err(|e| VideoError::Labels(format!("{}: {e}", info_path.display())))?;
    if info.chunk != ctx.instance {
        return Err(VideoError::Labels(format!(
            "{}: chunk {} sent to classify instance {}",
            info_path.display(),
            info.chunk,
            ctx.instance
        )));
    }
    let file = File::open(&frame_path).map_err(io_err(&frame_path))?;
    let mut reader = y4m::Reader::new(BufReader::new(file)).map_err(y4m_err(&frame_path))?;
    let header = reader.header().clone();
    let mut frame = Vec::new();
    if !reader
        .read_frame(&mut frame)
        .map_err(y4m_err(&frame_path))?
    {
        return Err(VideoError::NoFrames(frame_path));
    }
    let f = features(
        &frame[..header.width * header.height],
        header.width,
        header.height,
    );
    let (label, confidence) = model.classify(&f);
    let result = ChunkLabel {
        chunk: info.chunk,
        start_s: info.start_s,
        frames: info.frames,
        frame: info.frame,
        label,
        class: model.classes.get(label).cloned().unwrap_or_default(),
        confidence,
    };
    let json = serde_json::to_vec_pretty(&result).map_err(|e| VideoError::Labels(e.to_string()))?;
    ctx.write_output(RESULT, &label_file(result.chunk), &json)?;
    info!(
        chunk = result.chunk,
        class = result.class,
        confidence,
        "classify done"
    );
    Ok(result)
}

/// Every chunk's label, in chunk order: what a job's `result/label-*.json` files say together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Labels {
    pub chunks: usize,
    pub labels: Vec<ChunkLabel>,
}

impl Labels {
    /// Reads the label files among `paths` (a folder stands for its `label-*.json` files; other
    /// names are skipped) and checks there is exactly one label for each chunk `0..n`.
    pub fn read(paths: &[PathBuf]) -> Result<Labels, VideoError> {
        let mut files = Vec::new();
        for p in paths {
            if p.is_dir() {
                for entry in fs::read_dir(p).map_err(io_err(p))? {
                    files.push(entry.map_err(io_err(p))?.path());
                }
            } else {
                files.push(p.clone());
            }
        }
        let mut labels = Vec::new();
        for f in files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if !(name.starts_with(LABEL_PREFIX) && name.ends_with(".json")) {
                continue;
            }
            let bytes = fs::read(&f).map_err(io_err(&f))?;
            let l: ChunkLabel = serde_json::from_slice(&bytes)
                .map_err(|e| VideoError::Labels(format!("{}: {e}", f.display())))?;
            labels.push(l);
        }
        Labels::from_labels(labels)
    }

    /// Sorts `labels` by chunk and checks there is exactly one for each chunk `0..n`.
    pub fn from_labels(mut labels: Vec<ChunkLabel>) -> Result<Labels, VideoError> {
        labels.sort_by_key(|l| l.chunk);
        for (i, l) in labels.iter().enumerate() {
            if l.chunk as usize != i {
                return Err(VideoError::Labels(format!(
                    "chunk {i} has {} labels",
                    if (l.chunk as usize) < i { "two" } else { "no" }
                )));
            }
        }
        if labels.is_empty() {
            return Err(VideoError::Labels("no label found".into()));
        }
        Ok(Labels {
            chunks: labels.len(),
            labels,
        })
    }
}

/// What the DAG computes, in one process: every chunk's label for the video at `path`, cut in
/// chunks of `chunk_seconds`, the representative frame picked by `how` (`middle` or
/// `max-variance`). A job's result files must say exactly this.
pub fn reference_labels(path: &Path, chunk_seconds: f64, how: &str) -> Result<Labels, VideoError> {
    let model = Classifier::embedded()?;
    let file = File::open(path).map_err(io_err(path))?;
    let mut reader = y4m::Reader::new(BufReader::new(file)).map_err(y4m_err(path))?;
    let header = reader.header().clone();
    let fpc = frames_per_chunk(&header, chunk_seconds);
    let luma = header.width * header.height;
    let mut labels = Vec::new();
    let mut chunk: Vec<Vec<u8>> = Vec::new();
    let mut finish = |chunk: &mut Vec<Vec<u8>>| -> Result<(), VideoError> {
        if chunk.is_empty() {
            return Ok(());
        }
        let k = labels.len() as u32;
        let pick = pick_frame(chunk, luma, how)?;
        let (label, confidence) =
            model.classify(&features(&chunk[pick][..luma], header.width, header.height));
        labels.push(ChunkLabel {
            chunk: k,
            start_s: (u64::from(k) * fpc) as f64 / header.fps(),
            frames: chunk.len() as u64,
            frame: pick as u64,
            label,
            class: model.classes.get(label).cloned().unwrap_or_default(),
            confidence,
        });
        chunk.clear();
        Ok(())
    };
    let mut buf = Vec::new();
    while reader.read_frame(&mut buf).map_err(y4m_err(path))? {
        chunk.push(std::mem::take(&mut buf));
        if chunk.len() as u64 == fpc {
            finish(&mut chunk)?;
        }
    }
    finish(&mut chunk)?;
    Labels::from_labels(labels)
}

/// The fraction of chunks whose label is the truth.
pub fn score(labels: &Labels, truth: &[usize]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    let right = labels
        .labels
        .iter()
        .zip(truth)
        .filter(|(l, t)| l.label == **t)
        .count();
    right as f64 / truth.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seconds: u32, seed: u64) -> VideoSpec {
        VideoSpec {
            seconds,
            scene_seconds: 2,
            seed,
            ..VideoSpec::default()
        }
    }

    #[test]
    fn generated_video_reads_back_with_one_scene_per_period() {
        let s = spec(7, 3);
        let mut bytes = Vec::new();
        let truth = generate(&mut bytes, &s).unwrap();
        let scenes = truth.scenes.clone();
        assert_eq!(scenes.len(), 4);
        assert_eq!(truth.class_at(69), Some(scenes[3]));
        assert_eq!(truth.class_at(79), Some(scenes[3]));
        assert_eq!(truth.class_at(80), None);
        let mut r = y4m::Reader::new(&bytes[..]).unwrap();
        let mut buf = Vec::new();
        let mut n = 0;
        while r.read_frame(&mut buf).unwrap() {
            n += 1;
        }
        assert_eq!(n, 70);
        let mut again = Vec::new();
        generate(&mut again, &s).unwrap();
        assert_eq!(bytes, again);
        // Truth per chunk follows the scenes; 7 s in 2 s chunks is 4 chunks.
        assert_eq!(s.chunk_truth(2.0), scenes);
        assert_eq!(s.chunk_truth(3.0).len(), 3);
        assert_eq!(s.class_at(0), scenes[0]);
    }

    #[test]
    fn features_see_orientation() {
        let (w, h) = (32, 32);
        let hstripes: Vec<u8> = (0..w * h)
            .map(|i| if (i / w) % 8 < 4 { 40 } else { 200 })
            .collect();
        let vstripes: Vec<u8> = (0..w * h)
            .map(|i| if (i % w) % 8 < 4 { 40 } else { 200 })
            .collect();
        let fh = features(&hstripes, w, h);
        let fv = features(&vstripes, w, h);
        // Horizontal stripes have vertical gradients (90 degrees), vertical ones horizontal.
        assert!(fh[4] > 0.9, "{fh:?}");
        assert!(fv[0] > 0.9, "{fv:?}");
        assert!(fh[9] > 0.9 && fv[9] > 0.9);
        let flat = vec![128u8; w * h];
        assert_eq!(features(&flat, w, h), [0.0; FEATURES]);
    }

    #[test]
    fn training_from_scratch_learns_the_classes() {
        let c = train(400, 11, 150);
        assert!(c.training.train_accuracy > 0.9, "{:?}", c.training);
        assert!(c.training.holdout_accuracy > 0.85, "{:?}", c.training);
    }

    #[test]
    fn the_shipped_model_is_accurate_on_fresh_frames() {
        let c = Classifier::embedded().unwrap();
        let fresh = sample_frames(500, 0xABCDEF, 64, 48);
        let acc = sample_accuracy(&c, &fresh);
        assert!(acc > 0.95, "accuracy {acc} on fresh frames");
    }

    #[test]
    fn models_with_wrong_shapes_are_refused() {
        let mut c = Classifier::embedded().unwrap();
        c.bias.pop();
        let json = serde_json::to_string(&c).unwrap();
        assert!(Classifier::from_json(&json).is_err());
        assert!(Classifier::from_json("{}").is_err());
    }

    #[test]
    fn bounce_stays_inside() {
        for p in [-50.0, -1.0, 0.0, 3.0, 10.0, 11.0, 99.5] {
            let v = bounce(p, 2.0, 10.0);
            assert!((2.0..=10.0).contains(&v), "{p} -> {v}");
        }
        assert_eq!(bounce(11.0, 2.0, 10.0), 9.0);
    }
}
