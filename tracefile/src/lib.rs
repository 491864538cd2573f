//! Trace files on disk: the writer a node records into ([`FileSink`]: one directory
//! per node, files of a capped size, the oldest removed past a count), the reader
//! ([`read_node`], [`read_paths`]) and the traffic summary ([`summary`]). The format is
//! `tessera_core::trace`'s.

pub mod summary;
pub mod workload;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tessera_core::trace::{self, MAGIC, Sink, TraceError, TraceFile};

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
    out: Option<BufWriter<File>>,
    index: u64,
    /// The file holding the current run's start record.
    start_index: u64,
    written: u64,
    failed: bool,
}

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
            written: 0,
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
        if let Some(mut out) = self.out.take() {
            out.flush()?;
        }
        self.index += 1;
        let path = self.dir.join(file_name(self.index));
        let mut out = BufWriter::with_capacity(256 << 10, File::create(&path)?);
        let mut head = MAGIC.to_vec();
        trace::frame(
            &trace::header(&self.node, &self.role, self.index, first_seq),
            &mut head,
        );
        out.write_all(&head)?;
        // A file is never left without its header, whenever the node stops.
        out.flush()?;
        self.written = head.len() as u64;
        self.out = Some(out);
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
        // A start record (a new run) and a full file each begin a file.
        if (self.out.is_none() || seq == 1 || self.written >= self.rotation.file_bytes)
            && let Err(e) = self.begin(seq)
        {
            return self.fail(format!("cannot begin a trace file: {e}"));
        }
        let out = self.out.as_mut().expect("a file is open");
        if let Err(e) = out.write_all(frame) {
            return self.fail(format!("cannot write: {e}"));
        }
        self.written += frame.len() as u64;
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
        self.flush();
    }
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
            what: "no trace files (NNNNNN.trace) here".into(),
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
            trace::parse(&name, &bytes).map(|f| (name, f))
        })
        .collect()
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
            nodes.push(vec![(name.clone(), trace::parse(&name, &bytes)?)]);
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
            file_bytes: 4096,
            files: 3,
        };
        let mut sink = FileSink::open(&root, "master", "m:1", rotation).unwrap();
        for seq in 1..=2000 {
            sink.record(seq, &record(seq));
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
        let _ = std::fs::remove_dir_all(&root);
    }
}
