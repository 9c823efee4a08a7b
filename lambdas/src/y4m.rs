//! YUV4MPEG2 (`.y4m`): uncompressed video that ffmpeg, mpv and x264 read, trivial to write and
//! parse, so the video application needs no codec.
//!
//! A stream is one header line (`YUV4MPEG2 W64 H48 F10:1 Ip A1:1 C420jpeg`) and frames, each a
//! `FRAME` line (maybe with parameters) followed by the Y, U and V planes.

use std::io::{self, BufRead, Read, Write};

/// How chroma is sampled, which sets the plane sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chroma {
    /// 4:2:0 (every `C420*` variant): chroma planes at half width and half height.
    C420,
    C422,
    C444,
    /// Luma only.
    Mono,
}

/// A stream header. Unknown tokens (interlacing, aspect, `X` comments) are kept as they are, so a
/// chunk written with the same header is the same kind of stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub width: usize,
    pub height: usize,
    pub fps_num: u32,
    pub fps_den: u32,
    pub chroma: Chroma,
    /// The header line without its newline, as read or as built.
    pub line: String,
}

/// What is wrong with a stream.
#[derive(Debug, thiserror::Error)]
pub enum Y4mError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("not a YUV4MPEG2 stream: {0}")]
    Header(String),
    #[error("frame {index}: {reason}")]
    Frame { index: u64, reason: String },
}

impl Header {
    /// A 4:2:0 progressive header.
    pub fn new(width: usize, height: usize, fps_num: u32, fps_den: u32) -> Header {
        Header {
            width,
            height,
            fps_num,
            fps_den,
            chroma: Chroma::C420,
            line: format!("YUV4MPEG2 W{width} H{height} F{fps_num}:{fps_den} Ip A1:1 C420jpeg"),
        }
    }

    /// Parses a header line (without the newline).
    pub fn parse(line: &str) -> Result<Header, Y4mError> {
        let bad = |why: String| Y4mError::Header(why);
        let mut tokens = line.split(' ');
        if tokens.next() != Some("YUV4MPEG2") {
            return Err(bad("missing the YUV4MPEG2 signature".into()));
        }
        let (mut w, mut h, mut fps) = (None, None, None);
        let mut chroma = Chroma::C420;
        for t in tokens.filter(|t| !t.is_empty()) {
            let (tag, value) = t.split_at(1);
            match tag {
                "W" => w = value.parse::<usize>().ok().filter(|&v| v > 0),
                "H" => h = value.parse::<usize>().ok().filter(|&v| v > 0),
                "F" => {
                    fps = value
                        .split_once(':')
                        .and_then(|(n, d)| Some((n.parse::<u32>().ok()?, d.parse::<u32>().ok()?)))
                        .filter(|&(n, d)| n > 0 && d > 0);
                    if fps.is_none() {
                        return Err(bad(format!("bad frame rate {t:?}")));
                    }
                }
                "C" => {
                    chroma = match value {
                        v if v.starts_with("420") => Chroma::C420,
                        "422" => Chroma::C422,
                        "444" => Chroma::C444,
                        "mono" => Chroma::Mono,
                        other => return Err(bad(format!("unsupported colour space C{other}"))),
                    }
                }
                _ => {}
            }
        }
        let (Some(width), Some(height)) = (w, h) else {
            return Err(bad("missing or bad W/H".into()));
        };
        // The format makes the frame rate mandatory; be lenient like most readers.
        let (fps_num, fps_den) = fps.unwrap_or((25, 1));
        Ok(Header {
            width,
            height,
            fps_num,
            fps_den,
            chroma,
            line: line.to_string(),
        })
    }

    /// Width and height of each chroma plane (0 for mono).
    pub fn chroma_size(&self) -> (usize, usize) {
        match self.chroma {
            Chroma::C420 => (self.width.div_ceil(2), self.height.div_ceil(2)),
            Chroma::C422 => (self.width.div_ceil(2), self.height),
            Chroma::C444 => (self.width, self.height),
            Chroma::Mono => (0, 0),
        }
    }

    /// Bytes of one frame's planes.
    pub fn frame_bytes(&self) -> usize {
        let (cw, ch) = self.chroma_size();
        self.width * self.height + 2 * cw * ch
    }

    /// Frames per second.
    pub fn fps(&self) -> f64 {
        f64::from(self.fps_num) / f64::from(self.fps_den)
    }
}

/// Reads frames one at a time.
pub struct Reader<R> {
    inner: R,
    header: Header,
    frames: u64,
}

/// Reads one `\n`-terminated line of at most `limit` bytes; `None` at a clean end of stream.
fn read_line(r: &mut impl BufRead, limit: usize) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = Read::take(&mut *r, limit as u64).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "line too long or truncated",
        ));
    }
    buf.pop();
    String::from_utf8(buf)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl<R: BufRead> Reader<R> {
    pub fn new(mut inner: R) -> Result<Self, Y4mError> {
        let line = read_line(&mut inner, 4096)
            .map_err(|e| Y4mError::Header(e.to_string()))?
            .ok_or_else(|| Y4mError::Header("empty stream".into()))?;
        let header = Header::parse(&line)?;
        Ok(Self {
            inner,
            header,
            frames: 0,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The next frame's planes (Y, then U, then V) into `buf`; false at the end of the stream.
    pub fn read_frame(&mut self, buf: &mut Vec<u8>) -> Result<bool, Y4mError> {
        let index = self.frames;
        let frame_err = |reason: String| Y4mError::Frame { index, reason };
        let Some(line) = read_line(&mut self.inner, 4096).map_err(|e| frame_err(e.to_string()))?
        else {
            return Ok(false);
        };
        if line != "FRAME" && !line.starts_with("FRAME ") {
            return Err(frame_err(format!("expected FRAME, got {line:?}")));
        }
        buf.resize(self.header.frame_bytes(), 0);
        self.inner
            .read_exact(buf)
            .map_err(|e| frame_err(format!("truncated planes: {e}")))?;
        self.frames += 1;
        Ok(true)
    }

    /// Frames read so far.
    pub fn frames_read(&self) -> u64 {
        self.frames
    }
}

/// Writes a header, then frames.
pub struct Writer<W> {
    inner: W,
    frame_bytes: usize,
}

impl<W: Write> Writer<W> {
    pub fn new(mut inner: W, header: &Header) -> io::Result<Self> {
        inner.write_all(header.line.as_bytes())?;
        inner.write_all(b"\n")?;
        Ok(Self {
            inner,
            frame_bytes: header.frame_bytes(),
        })
    }

    pub fn write_frame(&mut self, planes: &[u8]) -> io::Result<()> {
        if planes.len() != self.frame_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a frame has {} bytes, this stream's frames {}",
                    planes.len(),
                    self.frame_bytes
                ),
            ));
        }
        self.inner.write_all(b"FRAME\n")?;
        self.inner.write_all(planes)
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_and_size_frames() {
        let check = |line: &str, expect: Option<(usize, usize, f64, usize)>| match (
            Header::parse(line),
            expect,
        ) {
            (Ok(h), Some((w, hh, fps, bytes))) => {
                assert_eq!(
                    (h.width, h.height, h.fps(), h.frame_bytes()),
                    (w, hh, fps, bytes)
                );
                assert_eq!(h.line, line);
            }
            (Err(_), None) => {}
            (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
        };
        check(
            "YUV4MPEG2 W64 H48 F10:1 Ip A1:1 C420jpeg",
            Some((64, 48, 10.0, 4608)),
        );
        check(
            "YUV4MPEG2 W5 H3 F30000:1001 C420",
            Some((5, 3, 30000.0 / 1001.0, 15 + 2 * 3 * 2)),
        );
        check(
            "YUV4MPEG2 W4 H2 F25:1 C444 XYSCSS=444",
            Some((4, 2, 25.0, 24)),
        );
        check("YUV4MPEG2 W4 H2 F25:1 Cmono", Some((4, 2, 25.0, 8)));
        check("YUV4MPEG2 H2 F25:1", None);
        check("YUV4MPEG W4 H2", None);
        check("YUV4MPEG2 W4 H2 F0:1", None);
        check("YUV4MPEG2 W4 H2 F1:1 C411", None);
    }

    #[test]
    fn frames_round_trip_and_truncation_is_an_error() {
        let h = Header::new(4, 2, 10, 1);
        let mut w = Writer::new(Vec::new(), &h).unwrap();
        let f1: Vec<u8> = (0..12).collect();
        let f2: Vec<u8> = (100..112).collect();
        w.write_frame(&f1).unwrap();
        w.write_frame(&f2).unwrap();
        assert!(w.write_frame(&[0; 3]).is_err());
        let bytes = w.into_inner();
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert_eq!(r.header(), &h);
        let mut buf = Vec::new();
        assert!(r.read_frame(&mut buf).unwrap());
        assert_eq!(buf, f1);
        assert!(r.read_frame(&mut buf).unwrap());
        assert_eq!(buf, f2);
        assert!(!r.read_frame(&mut buf).unwrap());
        assert_eq!(r.frames_read(), 2);

        let mut r = Reader::new(&bytes[..bytes.len() - 1]).unwrap();
        assert!(r.read_frame(&mut buf).unwrap());
        assert!(r.read_frame(&mut buf).is_err());
        // Frame parameters are allowed.
        let mut with_params = format!("{}\nFRAME Ixyz\n", h.line).into_bytes();
        with_params.extend_from_slice(&f1);
        let mut r = Reader::new(&with_params[..]).unwrap();
        assert!(r.read_frame(&mut buf).unwrap());
    }
}
