//! Trace files on disk: the writer a node records into ([`FileSink`]: one directory
//! per node, files of a capped size, the oldest removed past a count), the reader
//! ([`read_node`], [`read_paths`], [`parse_file`]) and the traffic summary
//! ([`summary`]). The format is `tessera_core::trace`'s; on disk ([`TRACE_FORMAT`]) the
//! record frames after a file's header are one zstd stream, flushed at each flush of
//! the sink, so a file cut by a crash still inflates up to its last flush.

pub mod fuzz;
pub mod summary;
pub mod workload;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tessera_core::trace::{self, MAGIC, RAW_FORMAT, Sink, TRACE_FORMAT, TraceError, TraceFile};

/// How big a trace file grows before the next is begun, and how many a node keeps.
#[derive(Clone, Copy, Debug)]
pub struct Rotation {
    pub file_bytes: u64,
    pub files: usize,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            file_bytes: 64 << 20,
            files: 16,
        }
    }
}

/// The directory name of a node's trace: its role and address (`master-127.0.0.1_7070`).
pub fn node_dir_name(role: &str, node: &str) -> String {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{role}-{safe}")
}

fn file_name(index: u64) -> String {
    format!("{index:06}.trace")
}

fn file_index(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?;
    let stem = name.strip_suffix(".trace")?;
    stem.parse().ok()
}

/// Trace files of a node's directory, in order.
fn trace_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if let Some(i) = file_index(&p) {
            out.push((i, p));
        }
    }
    out.sort();
    Ok(out)
}

/// Writes one node's trace into `DIR/<role>-<address>/NNNNNN.trace`, continuing after
/// files already there (a restarted node begins a new file), a new file once one passes
/// `rotation.file_bytes`, the oldest removed once there are more than `rotation.files`
/// (never the one holding the current run's start record).
/// Writing is buffered and reaches the file at each flush (the node's ticks). A failure
/// to write stops the trace, never the node: it is logged once.
pub struct FileSink {
    dir: PathBuf,
    node: String,
    role: String,
    rotation: Rotation,
    out: Option<zstd::stream::write::Encoder<'static, Counted>>,
    index: u64,
    /// The file holding the current run's start record.
    start_index: u64,
    failed: bool,
}

/// The file under the compressor, counting what reaches it (a file's size, for rotation).
struct Counted {
    file: BufWriter<File>,
    written: u64,
}

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// zstd's level for trace records: its fastest, which already shrinks them about
/// fourfold (they repeat addresses, handles and field tags).
const LEVEL: i32 = 1;

/// The most a file's records may inflate to, as a multiple of their compressed size:
/// real traces inflate about fivefold; more is a damaged or forged file, not memory to
/// give it.
const MAX_INFLATE: usize = 64;

impl FileSink {
    /// A sink for the node `node` (its address) of `role` ("master" or "chunkserver")
    /// under `root`.
    pub fn open(
        root: &Path,
        role: &str,
        node: &str,
        rotation: Rotation,
    ) -> Result<FileSink, String> {
        let dir = root.join(node_dir_name(role, node));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the trace directory {}: {e}", dir.display()))?;
        let last = trace_files(&dir)
            .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
            .last()
            .map_or(0, |(i, _)| *i);
        Ok(FileSink {
            dir,
            node: node.to_string(),
            role: role.to_string(),
            rotation,
            out: None,
            index: last,
            start_index: 0,
            failed: false,
        })
    }

    /// The node's trace directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn fail(&mut self, what: String) {
        if !self.failed {
            tracing::error!(dir = %self.dir.display(), "tracing stopped: {what}");
        }
        self.failed = true;
        self.out = None;
    }

    /// Begins the next file, its header naming `first_seq`, and removes the oldest past
    /// the count.
    fn begin(&mut self, first_seq: u64) -> std::io::Result<()> {
        if let Some(out) = self.out.take() {
            out.finish()?.flush()?;
        }
        self.index += 1;
        let path = self.dir.join(file_name(self.index));
        // Readable by the node's own user only: a master's trace holds its settings, the
        // cluster's capability secret among them, and chunkservers' its keys.
        let mut open = std::fs::OpenOptions::new();
        open.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        let mut file = BufWriter::with_capacity(256 << 10, open.open(&path)?);
        let mut head = MAGIC.to_vec();
        trace::frame(
            &trace::header(TRACE_FORMAT, &self.node, &self.role, self.index, first_seq),
            &mut head,
        );
        file.write_all(&head)?;
        // A file is never left without its header, whenever the node stops.
        file.flush()?;
        let counted = Counted {
            file,
            written: head.len() as u64,
        };
        self.out = Some(zstd::stream::write::Encoder::new(counted, LEVEL)?);
        if first_seq == 1 {
            self.start_index = self.index;
        }
        // The oldest files go, but never the one holding the current run's start record:
        // without it nothing after it replays.
        let old: Vec<PathBuf> = trace_files(&self.dir)?
            .into_iter()
            .filter(|(i, _)| *i != self.start_index)
            .map(|(_, p)| p)
            .collect();
        let keep = self.rotation.files.saturating_sub(1);
        if old.len() > keep {
            for p in &old[..old.len() - keep] {
                std::fs::remove_file(p)?;
            }
        }
        Ok(())
    }
}

impl Sink for FileSink {
    fn record(&mut self, seq: u64, frame: &[u8]) {
        if self.failed {
            return;
        }
        // A start record (a new run) and a full file each begin a file. (What is still
        // in the compressor is not counted: a file may pass its size by that much.)
        let full = self
            .out
            .as_ref()
            .is_none_or(|o| o.get_ref().written >= self.rotation.file_bytes);
        if (full || seq == 1)
            && let Err(e) = self.begin(seq)
        {
            return self.fail(format!("cannot begin a trace file: {e}"));
        }
        let out = self.out.as_mut().expect("a file is open");
        if let Err(e) = out.write_all(frame) {
            self.fail(format!("cannot write: {e}"));
        }
    }

    fn flush(&mut self) {
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            self.fail(format!("cannot write: {e}"));
        }
    }
}

impl Drop for FileSink {
    fn drop(&mut self) {
        // The stream's end, so the file reads as whole (a crash leaves it cut after the
        // last flush instead, which reads too).
        if let Some(out) = self.out.take()
            && let Err(e) = out.finish().and_then(|mut f| f.flush())
        {
            self.fail(format!("cannot write: {e}"));
        }
    }
}

/// Reads one trace file's bytes, of either format (`file` names it in errors): a
/// [`TRACE_FORMAT`] file's records are inflated, then read as `tessera_core::trace`
/// reads frames (an error in them names its offset among the inflated bytes). A file
/// cut by a crash gives the records up to its last flush.
pub fn parse_file(file: &str, bytes: &[u8]) -> Result<TraceFile, TraceError> {
    let (mut out, at) = trace::parse_header(file, bytes)?;
    if out.cut.is_some() || out.header.format == RAW_FORMAT {
        return trace::parse(file, bytes);
    }
    let (records, end) = inflate(file, &bytes[at..], at as u64)?;
    // Offsets among the inflated records mean nothing in the file: named apart.
    let inflated = |e: TraceError| TraceError {
        file: e.file,
        offset: at as u64,
        what: format!(
            "in the compressed records, at byte {} of them inflated: {}",
            e.offset, e.what
        ),
    };
    trace::parse_records(file, &records, 0, &mut out).map_err(inflated)?;
    out.cut = out.cut.map(inflated);
    match end {
        Stream::Ended => {}
        Stream::Open => out.open = true,
        Stream::Cut(cut) => {
            out.open = true;
            out.cut = out.cut.or(Some(cut));
        }
    }
    Ok(out)
}

/// Inflates a file's compressed records (`base`: where they begin in the file): the
/// bytes, and where the stream was cut if it does not end (a crash after the last
/// flush).
fn inflate(file: &str, bytes: &[u8], base: u64) -> Result<(Vec<u8>, Stream), TraceError> {
    use zstd::stream::raw::{Decoder, Operation};
    let err = |offset: usize, what: String| TraceError {
        file: file.to_string(),
        offset: base + offset as u64,
        what,
    };
    let mut d = Decoder::new().map_err(|e| err(0, format!("cannot inflate: {e}")))?;
    // Level 1 writes with a window of at most a few MiB: a stream asking for more is not
    // one of ours, and gets no memory for it.
    d.set_parameter(zstd::stream::raw::DParameter::WindowLogMax(WINDOW_LOG_MAX))
        .map_err(|e| err(0, format!("cannot inflate: {e}")))?;
    let limit = bytes.len().saturating_mul(MAX_INFLATE).max(1 << 20);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0;
    // What zstd expects next: nothing (0) where a frame ends; a block's header (3 bytes,
    // `ZSTD_blockHeaderSize`) where a flush left it; more inside a block. Nothing at all
    // is a file whose records never reached it.
    let mut next = 0;
    loop {
        let s = d
            .run_on_buffers(&bytes[at..], &mut buf)
            .map_err(|e| err(at, format!("the compressed records do not inflate: {e}")))?;
        at += s.bytes_read;
        out.extend_from_slice(&buf[..s.bytes_written]);
        if out.len() > limit {
            return Err(err(
                at,
                format!("the records inflate past {MAX_INFLATE} times their size (a damaged file)"),
            ));
        }
        if s.bytes_read == 0 && s.bytes_written == 0 {
            break;
        }
        next = s.remaining;
    }
    if at < bytes.len() {
        return Err(err(at, "the compressed records stop inflating here".into()));
    }
    let end = match next {
        0 => Stream::Ended,
        BLOCK_HEADER => Stream::Open,
        _ => Stream::Cut(err(
            bytes.len(),
            "the compressed records end inside a block (a crash while writing)".into(),
        )),
    };
    Ok((out, end))
}

/// The largest zstd window a trace's stream may ask for (16 MiB).
const WINDOW_LOG_MAX: u32 = 24;

/// zstd's block header size: what its decoder asks for next at a block boundary.
const BLOCK_HEADER: usize = 3;

/// How a file's compressed records end.
enum Stream {
    /// Closed: the stream's end is there.
    Ended,
    /// At a flush, never ended: the node stopped with the file open.
    Open,
    /// Inside a block: the node stopped while writing it.
    Cut(TraceError),
}

/// Reads a node's trace directory: its files in order, each checked.
pub fn read_node(dir: &Path) -> Result<Vec<(String, TraceFile)>, TraceError> {
    let io = |e: std::io::Error| TraceError {
        file: dir.display().to_string(),
        offset: 0,
        what: format!("cannot read: {e}"),
    };
    let files = trace_files(dir).map_err(io)?;
    if files.is_empty() {
        return Err(TraceError {
            file: dir.display().to_string(),
            offset: 0,
            what: "no trace files (NNNNNN.trace) here (a master group's replica records \
                   only while it leads: one that never led has none)"
                .into(),
        });
    }
    files
        .into_iter()
        .map(|(_, p)| {
            let name = p.display().to_string();
            let bytes = std::fs::read(&p).map_err(|e| TraceError {
                file: name.clone(),
                offset: 0,
                what: format!("cannot read: {e}"),
            })?;
            parse_file(&name, &bytes).map(|f| (name, f))
        })
        .collect::<Result<Vec<_>, TraceError>>()
        .and_then(closed_within_runs)
}

/// A file whose run goes on in the next file was closed whole (files rotate only
/// after their stream is ended): one that reads as cut, or never ended, is damaged.
fn closed_within_runs(
    files: Vec<(String, TraceFile)>,
) -> Result<Vec<(String, TraceFile)>, TraceError> {
    for w in files.windows(2) {
        let ((name, f), (_, next)) = (&w[0], &w[1]);
        let goes_on = next.header.first_seq > 1;
        if goes_on && f.header.format == TRACE_FORMAT && (f.open || f.cut.is_some()) {
            return Err(TraceError {
                file: name.clone(),
                offset: f.cut.as_ref().map_or(0, |c| c.offset),
                what: format!(
                    "the file ends short, though its run goes on in the next (from record {}): \
                     damaged",
                    next.header.first_seq
                ),
            });
        }
    }
    Ok(files)
}

/// The nodes under `paths`: each path a node's trace directory, a directory of them
/// (what `--trace-dir` names), or a single trace file.
pub fn read_paths(paths: &[PathBuf]) -> Result<Vec<Vec<(String, TraceFile)>>, TraceError> {
    let mut nodes = Vec::new();
    for p in paths {
        let fail = |e: std::io::Error| TraceError {
            file: p.display().to_string(),
            offset: 0,
            what: format!("cannot read: {e}"),
        };
        if p.is_file() {
            let name = p.display().to_string();
            let bytes = std::fs::read(p).map_err(fail)?;
            nodes.push(vec![(name.clone(), parse_file(&name, &bytes)?)]);
            continue;
        }
        if !trace_files(p).map_err(fail)?.is_empty() {
            nodes.push(read_node(p)?);
            continue;
        }
        let mut subs: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(fail)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|s| s.is_dir())
            .collect();
        subs.sort();
        let before = nodes.len();
        for s in subs {
            if !trace_files(&s).map_err(fail)?.is_empty() {
                nodes.push(read_node(&s)?);
            }
        }
        if nodes.len() == before {
            return Err(TraceError {
                file: p.display().to_string(),
                offset: 0,
                what: "no trace here: neither trace files nor node directories holding them".into(),
            });
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::pb;

    fn record(seq: u64) -> Vec<u8> {
        let mut out = Vec::new();
        trace::frame(
            &pb::TraceRecord {
                seq,
                now_ms: seq,
                kind: Some(pb::trace_record::Kind::Master(pb::TraceMasterStep {
                    input: Some(pb::trace_master_step::Input::LogSynced(seq)),
                    ..Default::default()
                })),
            },
            &mut out,
        );
        out
    }

    /// Files rotate at their size, the oldest go past the count, but the file holding
    /// the run's start record stays, so the run still replays from it; what is kept
    /// reads back in order, with the gap where files went.
    #[test]
    fn rotation_keeps_the_start_of_the_run() {
        let root = std::env::temp_dir().join(format!("tessera-rotation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let rotation = Rotation {
            file_bytes: 1024,
            files: 3,
        };
        let mut sink = FileSink::open(&root, "master", "m:1", rotation).unwrap();
        for seq in 1..=2000 {
            sink.record(seq, &record(seq));
            // What is flushed counts toward a file's size (the node flushes at its ticks).
            if seq % 20 == 0 {
                sink.flush();
            }
        }
        sink.flush();
        let dir = sink.dir().to_path_buf();
        let files = trace_files(&dir).unwrap();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[0].0, 1, "the start file stays");
        let read = read_node(&dir).unwrap();
        assert_eq!(read[0].1.records[0].seq, 1);
        assert!(read[1].1.header.first_seq > 2);
        assert_eq!(read[2].1.records.last().unwrap().seq, 2000);
        // A restarted node continues after the files there, and its new run begins a file.
        drop(sink);
        let mut sink = FileSink::open(&root, "master", "m:1", rotation).unwrap();
        sink.record(1, &record(1));
        sink.flush();
        let files = trace_files(&dir).unwrap();
        assert_eq!(files.len(), 3, "{files:?}");
        let last = read_node(&dir).unwrap().pop().unwrap().1;
        assert_eq!((last.header.first_seq, last.records.len()), (1, 1));
        // Every file is the node's user's alone: a master's holds the cluster's secret.
        #[cfg(unix)]
        for (_, path) in &files {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    fn written(sink: &FileSink) -> Vec<u8> {
        let files = trace_files(sink.dir()).unwrap();
        std::fs::read(&files.last().unwrap().1).unwrap()
    }

    /// Records are compressed after the header; a file whose node crashed after a flush
    /// (the stream never ended) reads up to that flush, and one cut inside a compressed
    /// block reads up to the block before, each saying it was cut.
    #[test]
    fn a_compressed_file_cut_by_a_crash_reads_to_its_last_flush() {
        let root = std::env::temp_dir().join(format!("tessera-cut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut sink = FileSink::open(&root, "master", "m:1", Rotation::default()).unwrap();
        for seq in 1..=300 {
            sink.record(seq, &record(seq));
            if seq % 100 == 0 {
                sink.flush();
            }
        }
        let bytes = written(&sink);
        let raw: usize = (1..=300).map(|s| record(s).len()).sum();
        // (Each of these tiny records carries a CRC: real ones shrink far more.)
        assert!(bytes.len() < raw, "{} bytes for {raw}", bytes.len());
        let f = parse_file("t", &bytes).unwrap();
        assert_eq!(f.header.format, TRACE_FORMAT);
        assert_eq!(f.records.len(), 300);
        assert!(
            f.open && f.cut.is_none(),
            "stopped at a flush: open, not cut"
        );
        // Cut inside the last block: the first two flushes' records.
        let (_, at) = trace::parse_header("t", &bytes).unwrap();
        let mut cut_at = bytes.len() - 3;
        let f = loop {
            let f = parse_file("t", &bytes[..cut_at]).unwrap();
            if f.records.len() < 300 {
                break f;
            }
            cut_at -= 1;
        };
        assert!(cut_at > at);
        assert_eq!(f.records.len(), 200, "cut at {cut_at} of {}", bytes.len());
        assert!(f.open && f.cut.is_some());
        // A stream ended cleanly (the sink dropped) is whole.
        drop(sink);
        let f = parse_file(
            "t",
            &std::fs::read(root.join("master-m_1/000001.trace")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (f.records.len(), f.cut.is_none(), f.open),
            (300, true, false)
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Files rotate only once their stream is ended: a file whose run goes on in the next
    /// and that reads as cut or open was damaged, and the node's trace does not read.
    #[test]
    fn a_short_file_inside_a_run_is_damage() {
        let root = std::env::temp_dir().join(format!("tessera-short-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let rotation = Rotation {
            file_bytes: 1024,
            files: 16,
        };
        let mut sink = FileSink::open(&root, "master", "m:1", rotation).unwrap();
        for seq in 1..=600 {
            sink.record(seq, &record(seq));
            if seq % 20 == 0 {
                sink.flush();
            }
        }
        drop(sink);
        let dir = root.join("master-m_1");
        let files = trace_files(&dir).unwrap();
        assert!(files.len() >= 3, "{files:?}");
        assert!(read_node(&dir).unwrap().iter().all(|(_, f)| !f.open));
        let p = &files[1].1;
        let bytes = std::fs::read(p).unwrap();
        std::fs::write(p, &bytes[..bytes.len() - 5]).unwrap();
        let e = read_node(&dir).unwrap_err();
        assert!(e.what.contains("its run goes on"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Damage in the compressed records is an error naming the file, never a panic, and
    /// never more memory than the file's size justifies.
    #[test]
    fn damaged_compressed_records_are_an_error() {
        let root = std::env::temp_dir().join(format!("tessera-damaged-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut sink = FileSink::open(&root, "master", "m:1", Rotation::default()).unwrap();
        for seq in 1..=300 {
            sink.record(seq, &record(seq));
        }
        drop(sink);
        let bytes = std::fs::read(root.join("master-m_1/000001.trace")).unwrap();
        let (_, at) = trace::parse_header("t", &bytes).unwrap();
        let mut errors = 0;
        for i in at..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            match parse_file("bad.trace", &bad) {
                Err(e) => {
                    assert!(e.to_string().starts_with("bad.trace"), "{e}");
                    errors += 1;
                }
                // A flipped bit the stream's own structure absorbs (in a size hint, or
                // padding) still reads every record, or says where it was cut.
                Ok(f) => assert!(f.records.len() == 300 || f.cut.is_some()),
            }
        }
        // (Of 3,528 single flips, 3,507 were errors when this was written.)
        assert!(errors * 100 > (bytes.len() - at) * 95, "{errors} errors");
        // A forged stream that inflates far past its size.
        let mut bomb = bytes[..at].to_vec();
        bomb.extend(zstd::encode_all(&vec![0u8; 64 << 20][..], 19).unwrap());
        let e = parse_file("bomb.trace", &bomb).unwrap_err();
        assert!(e.what.contains("inflate past"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
