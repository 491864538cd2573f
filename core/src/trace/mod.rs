//! Traces: what crossed a node's driver, written as it happened, so the node can be
//! rebuilt and replayed, a cluster's traffic summarised, and a workload fed to the
//! simulator. The records are `trace.proto`'s; this module frames them into files
//! ([`frame`], [`parse`]), turns a driver's steps into records and back (`record`), and
//! replays a master (`replay`); `tessera-tracefile` summarises traffic. It does no I/O: the
//! files are written by a [`Sink`] of the runtime's (`tessera-tracefile`).
//!
//! A trace file is [`MAGIC`], then frames: a varint body length, the CRC32C of the body
//! (4 bytes, little-endian), the body (a prost message). The first frame is a
//! `TraceHeader`, every later one a `TraceRecord`. In format [`RAW_FORMAT`] the record
//! frames follow the header as they are (what [`MemSink`](recorder::MemSink) keeps); in
//! [`TRACE_FORMAT`], what nodes write to disk, they are one zstd stream, which
//! `tessera-tracefile` writes and inflates (this crate parses the inflated frames:
//! [`parse_header`], [`parse_records`]). A node's trace directory holds its files
//! `NNNNNN.trace` in order; each start of the node begins a run with a start record
//! (`seq` 1) holding what the node was rebuilt from.

pub mod record;
pub mod recorder;
pub mod replay;

use prost::Message;

use crate::pb;

pub use recorder::{Recorder, Sink};

/// The trace format nodes write to disk: record frames in one zstd stream after the
/// header.
pub const TRACE_FORMAT: u32 = 2;
/// The format whose record frames follow the header as they are (in memory; and on disk
/// before records were compressed). Both read.
pub const RAW_FORMAT: u32 = 1;
/// The first bytes of every trace file.
pub const MAGIC: &[u8; 8] = b"TSRTRACE";
/// The largest frame body a reader accepts: a start record holds a whole checkpoint.
pub const MAX_FRAME: u64 = 1 << 30;

/// This build's version.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// A fingerprint of this build's protocol code: the .proto files and the state machines'
/// sources (computed by `build.rs`).
pub fn protocol() -> u64 {
    u64::from_str_radix(env!("TESSERA_PROTOCOL"), 16).expect("build.rs writes hex")
}

/// The header of a node's `file_index`th trace file of `format`, whose first record is
/// `first_seq`.
pub fn header(
    format: u32,
    node: &str,
    role: &str,
    file_index: u64,
    first_seq: u64,
) -> pb::TraceHeader {
    pb::TraceHeader {
        format,
        node: node.to_string(),
        role: role.to_string(),
        build: BUILD.to_string(),
        protocol: protocol(),
        file_index,
        first_seq,
    }
}

/// Appends `msg` to `out` as one frame.
pub fn frame(msg: &impl Message, out: &mut Vec<u8>) {
    let len = msg.encoded_len();
    prost::encoding::encode_varint(len as u64, out);
    let at = out.len() + 4;
    out.extend_from_slice(&[0; 4]);
    msg.encode(out).expect("a Vec grows");
    let crc = crc32c::crc32c(&out[at..]);
    out[at - 4..at].copy_from_slice(&crc.to_le_bytes());
}

/// What is wrong with a trace file, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: at byte {offset}: {what}")]
pub struct TraceError {
    pub file: String,
    pub offset: u64,
    pub what: String,
}

/// One trace file, read.
#[derive(Clone, Debug, Default)]
pub struct TraceFile {
    pub header: pb::TraceHeader,
    pub records: Vec<pb::TraceRecord>,
    /// The file ends inside a frame: the node stopped while writing it. The records
    /// before it are sound.
    pub cut: Option<TraceError>,
    /// Its compressed records were never ended (format 2): the node stopped (a kill, a
    /// crash) with this file open, after its last flush. A file the same run goes on
    /// from in the next was closed, and ended: one that is not is damaged.
    pub open: bool,
}

/// Reads one trace file's bytes, of [`RAW_FORMAT`] (a [`TRACE_FORMAT`] file's records
/// are compressed: `tessera_tracefile::parse_file` reads both). A file that is not a
/// trace, of another format, or damaged (a frame failing its checksum or not decoding) is
/// an error naming `file` and the offset; a file cut short inside its last frame gives
/// the records before the cut and says where it is.
pub fn parse(file: &str, bytes: &[u8]) -> Result<TraceFile, TraceError> {
    let (mut out, at) = parse_header(file, bytes)?;
    if out.cut.is_some() {
        return Ok(out);
    }
    if out.header.format != RAW_FORMAT {
        return Err(TraceError {
            file: file.to_string(),
            offset: at as u64,
            what: format!(
                "trace format {} keeps its records compressed: read it with tessera_tracefile",
                out.header.format
            ),
        });
    }
    parse_records(file, &bytes[at..], at as u64, &mut out)?;
    Ok(out)
}

/// Reads a trace file's magic and header: the file with its header (or cut before the
/// header is whole), and where the records begin.
pub fn parse_header(file: &str, bytes: &[u8]) -> Result<(TraceFile, usize), TraceError> {
    let err = |offset: usize, what: String| TraceError {
        file: file.to_string(),
        offset: offset as u64,
        what,
    };
    if bytes.len() < MAGIC.len() && MAGIC.starts_with(bytes) {
        // Created, and cut (or not yet flushed) before its first bytes were written.
        let out = TraceFile {
            cut: Some(err(0, "the file ends before its header".into())),
            ..TraceFile::default()
        };
        return Ok((out, bytes.len()));
    }
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(err(0, "not a Tessera trace file (no trace magic)".into()));
    }
    let at = MAGIC.len();
    let mut out = TraceFile::default();
    let end = match next_frame(file, bytes, at)? {
        Frame::End => return Err(err(at, "the file has no header".into())),
        Frame::Cut(cut) => {
            // Cut inside the header: no header to go by.
            out.cut = Some(cut);
            return Ok((out, bytes.len()));
        }
        Frame::Body(body, end) => {
            let h = pb::TraceHeader::decode(body)
                .map_err(|e| err(at, format!("the header does not decode: {e}")))?;
            if h.format != TRACE_FORMAT && h.format != RAW_FORMAT {
                return Err(err(
                    at,
                    format!(
                        "trace format {} (this build reads formats {RAW_FORMAT} and \
                         {TRACE_FORMAT}; it was written by tessera {})",
                        h.format, h.build
                    ),
                ));
            }
            out.header = h;
            end
        }
    };
    Ok((out, end))
}

/// Reads record frames from `bytes` (which begin at `base` in what `file` names) into
/// `out`; a cut inside the last frame is noted in `out.cut`.
pub fn parse_records(
    file: &str,
    bytes: &[u8],
    base: u64,
    out: &mut TraceFile,
) -> Result<(), TraceError> {
    let mut at = 0;
    loop {
        match next_frame(file, bytes, at) {
            Err(mut e) => {
                e.offset += base;
                return Err(e);
            }
            Ok(Frame::End) => return Ok(()),
            Ok(Frame::Cut(mut cut)) => {
                cut.offset += base;
                out.cut = Some(cut);
                return Ok(());
            }
            Ok(Frame::Body(body, end)) => {
                let r = pb::TraceRecord::decode(body).map_err(|e| TraceError {
                    file: file.to_string(),
                    offset: base + at as u64,
                    what: format!("a record does not decode: {e}"),
                })?;
                if r.seq == 0 || r.kind.is_none() {
                    return Err(TraceError {
                        file: file.to_string(),
                        offset: base + at as u64,
                        what: "a record with no place or no content".into(),
                    });
                }
                out.records.push(r);
                at = end;
            }
        }
    }
}

enum Frame<'a> {
    /// No bytes left.
    End,
    /// The bytes end inside a frame (a crash while writing).
    Cut(TraceError),
    /// A whole frame's checked body, and where the next begins.
    Body(&'a [u8], usize),
}

/// The frame at `at` in `bytes`.
fn next_frame<'a>(file: &str, bytes: &'a [u8], at: usize) -> Result<Frame<'a>, TraceError> {
    let err = |offset: usize, what: String| TraceError {
        file: file.to_string(),
        offset: offset as u64,
        what,
    };
    if at >= bytes.len() {
        return Ok(Frame::End);
    }
    let start = at;
    // Zeros to the end: blocks a crash allocated but never wrote (a zero byte would read
    // as an empty frame, whose CRC32C is zero).
    if bytes[at..].iter().all(|&b| b == 0) {
        return Ok(Frame::Cut(err(
            start,
            "the file ends in zeros (a crash while writing)".into(),
        )));
    }
    let mut rest = &bytes[at..];
    let Ok(len) = prost::encoding::decode_varint(&mut rest) else {
        let left = &bytes[at..];
        if left.len() < 10 && left.iter().all(|b| b & 0x80 != 0) {
            return Ok(Frame::Cut(err(
                start,
                "the file ends inside a frame's length".into(),
            )));
        }
        return Err(err(start, "a frame length that is not a varint".into()));
    };
    if len > MAX_FRAME {
        return Err(err(
            start,
            format!("a frame of {len} bytes (damaged length)"),
        ));
    }
    let at = bytes.len() - rest.len();
    let need = 4 + len as usize;
    if bytes.len() - at < need {
        return Ok(Frame::Cut(err(
            start,
            format!(
                "the file ends inside a frame ({} of its {} bytes there)",
                bytes.len() - at,
                need
            ),
        )));
    }
    let want = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"));
    let body = &bytes[at + 4..at + need];
    let got = crc32c::crc32c(body);
    if got != want {
        return Err(err(
            start,
            format!("a frame fails its checksum (stored {want:#010x}, computed {got:#010x})"),
        ));
    }
    Ok(Frame::Body(body, at + need))
}

#[cfg(test)]
mod tests;

/// The name of a master request's kind.
pub fn master_method(r: &pb::master_request::Req) -> &'static str {
    match r {
        pb::master_request::Req::Mkdir(_) => "mkdir",
        pb::master_request::Req::Create(_) => "create",
        pb::master_request::Req::Delete(_) => "delete",
        pb::master_request::Req::Rename(_) => "rename",
        pb::master_request::Req::List(_) => "list",
        pb::master_request::Req::Stat(_) => "stat",
        pb::master_request::Req::GetChunks(_) => "get_chunks",
        pb::master_request::Req::GetWriteTarget(_) => "get_write_target",
        pb::master_request::Req::ExtendFile(_) => "extend_file",
        pb::master_request::Req::Heartbeat(_) => "heartbeat",
        pb::master_request::Req::ReportCorrupt(_) => "report_corrupt",
        pb::master_request::Req::Report(_) => "report",
        pb::master_request::Req::Fsck(_) => "fsck",
        pb::master_request::Req::ReserveAppend(_) => "reserve_append",
        pb::master_request::Req::Raft(_) => "raft",
        pb::master_request::Req::RaftBatch(_) => "raft_batch",
        pb::master_request::Req::ReplicaStatus(_) => "replica_status",
        pb::master_request::Req::ChangeMembers(_) => "change_members",
        pb::master_request::Req::SetPermissions(_) => "set_permissions",
    }
}

/// The name of a chunk request's kind.
pub fn chunk_method(r: &pb::chunk_request::Req) -> &'static str {
    match r {
        pb::chunk_request::Req::Read(_) => "read",
        pb::chunk_request::Req::Write(_) => "write",
        pb::chunk_request::Req::SetVersion(_) => "set_version",
        pb::chunk_request::Req::Clone(_) => "clone",
        pb::chunk_request::Req::Mend(_) => "mend",
        pb::chunk_request::Req::RevokeLease(_) => "revoke_lease",
        pb::chunk_request::Req::Apply(_) => "apply",
        pb::chunk_request::Req::Append(_) => "append",
        pb::chunk_request::Req::Push(_) => "push",
    }
}

/// One line about a record: its place, clock, input and how many effects it had.
pub fn describe(r: &pb::TraceRecord) -> String {
    use pb::trace_chunkserver_step::Input as C;
    use pb::trace_master_step::Input as M;
    use pb::trace_record::Kind;
    let body = match &r.kind {
        Some(Kind::MasterStart(s)) => format!(
            "master start: checkpoint through {}, {} log records after it",
            s.checkpoint.as_ref().map_or(0, |c| c.through_seq),
            s.tail.len()
        ),
        Some(Kind::ChunkserverStart(s)) => {
            format!(
                "chunkserver start: {} chunk metadata records",
                s.metas.len()
            )
        }
        Some(Kind::Master(s)) => {
            let input = match &s.input {
                Some(M::Request(q)) => {
                    let what = q
                        .req
                        .as_ref()
                        .and_then(|q| q.req.as_ref())
                        .map_or("empty", master_method);
                    format!("request {} {what}", q.id)
                }
                Some(M::CallResult(c)) => format!(
                    "call result {} ({})",
                    c.id,
                    match &c.result {
                        Some(pb::trace_master_call_result::Result::Ok(r)) if r.error.is_none() =>
                            "ok",
                        Some(pb::trace_master_call_result::Result::Ok(_)) => "error reply",
                        _ => "failed",
                    }
                ),
                Some(M::LogSynced(t)) => format!("log synced through {t}"),
                Some(M::Tick(_)) => "tick".into(),
                Some(M::Malformed(m)) => format!("malformed request {}", m.id),
                None => "no input".into(),
            };
            format!(
                "{input} -> {} log, {} replies, {} calls{}",
                s.log.len(),
                s.replies.len(),
                s.calls.len(),
                if s.checkpoint_through != 0 {
                    ", a checkpoint due"
                } else {
                    ""
                }
            )
        }
        Some(Kind::Chunkserver(s)) => {
            let input = match &s.input {
                Some(C::Request(q)) => {
                    let what = q
                        .req
                        .as_ref()
                        .and_then(|q| q.req.as_ref())
                        .map_or("empty", chunk_method);
                    format!("request {} {what}", q.id)
                }
                Some(C::CallResult(c)) => format!("call result {}", c.id),
                Some(C::StoreDone(d)) => format!("storage operation {} done", d.id),
                Some(C::Tick(_)) => "tick".into(),
                Some(C::DiskSpace(d)) => format!("disk space {:?}", d.free),
                Some(C::Malformed(m)) => format!("malformed request {}", m.id),
                None => "no input".into(),
            };
            format!(
                "{input} -> {} replies, {} calls, {} storage operations",
                s.replies.len(),
                s.calls.len(),
                s.store.len()
            )
        }
        None => "empty record".into(),
    };
    format!("#{} at {} ms: {body}", r.seq, r.now_ms)
}
