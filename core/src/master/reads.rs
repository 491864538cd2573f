//! What the namespace answers to reads (list, stat, chunk locations), as functions of
//! the metadata alone: the master answers them under its path locks, a shadow master
//! (`crate::group`) from the state it has applied, with the same code, permission
//! checks (`super::perms`) included.

use super::meta::Meta;
use super::namespace::DELETED_PREFIX;
use super::perms::Check;
use super::{LIST_PAGE, file_info, page_limit};
use crate::auth::Caller;
use crate::error::FsError;
use crate::pb;
use crate::types::ChunkHandle;

/// One page of the listing of the directory `path` (normalized).
pub fn list_page(
    meta: &Meta,
    path: &str,
    r: &pb::ListRequest,
    from: &Caller,
) -> Result<pb::ListResponse, FsError> {
    Check::new(&meta.ns, from).list(path)?;
    let limit = page_limit(r.limit, LIST_PAGE);
    let mut entries = meta
        .ns
        .list_after(path, &r.start_after)?
        .filter(|e| r.include_deleted || !e.name.starts_with(DELETED_PREFIX))
        .take(limit + 1)
        .map(|e| {
            let full = if path == "/" {
                format!("/{}", e.name)
            } else {
                format!("{path}/{}", e.name)
            };
            file_info(&meta.ns.names, full, e.node)
        })
        .collect::<Vec<_>>();
    let more = entries.len() > limit;
    entries.truncate(limit);
    Ok(pb::ListResponse { entries, more })
}

/// What `path` (normalized) is.
pub fn stat(meta: &Meta, path: &str, from: &Caller) -> Result<pb::FileInfo, FsError> {
    Check::new(&meta.ns, from).stat(path)?;
    if path == "/" {
        let p = meta.ns.names.to_pb(meta.ns.root);
        return Ok(pb::FileInfo {
            path: path.into(),
            is_dir: true,
            owner: p.owner,
            group: p.group,
            mode: p.mode,
            ..Default::default()
        });
    }
    meta.ns
        .get(path)
        .map(|n| file_info(&meta.ns.names, path.into(), n))
}

/// The chunks `first..first + count` (count 0: to the end) of the file at `path`
/// (normalized), each with the servers `replicas` names for it.
pub fn chunk_locations(
    meta: &Meta,
    path: &str,
    first: u64,
    count: u64,
    from: &Caller,
    mut replicas: impl FnMut(ChunkHandle, &super::Chunk) -> Vec<String>,
) -> Result<pb::GetChunksResponse, FsError> {
    Check::new(&meta.ns, from).read(path)?;
    let f = meta.ns.file(path)?;
    let end = if count == 0 {
        f.chunks.len() as u64
    } else {
        first.saturating_add(count).min(f.chunks.len() as u64)
    };
    let mut chunks = Vec::new();
    for index in first..end {
        let handle = f.chunks[index as usize];
        let c = meta
            .chunks
            .get(handle)
            .expect("a file's chunks are in the table");
        chunks.push(pb::ChunkLocation {
            index,
            handle,
            version: c.version,
            replicas: replicas(handle, c),
            corrupt_copies: 0,
            capabilities: Vec::new(),
        });
    }
    Ok(pb::GetChunksResponse {
        file_length: f.length,
        chunk_size: f.chunk_size.into(),
        chunks,
    })
}
