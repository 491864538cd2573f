//! `ChunkStore` on local files: one file per chunk for its data, the chunk metadata
//! (version, length, block checksums, write intent) in a rocksdb beside them.
//!
//! Durability (the contract is `tessera_core::runtime::ChunkStore`; ARCHITECTURE.md has
//! the chunkserver's steps):
//! - `write` writes into the chunk file at the offset (space is allocated lazily, as the
//!   file grows); `write_meta` puts the metadata with the WAL on, unsynced.
//! - `sync(h)` fsyncs the chunk's file, then the metadata WAL. After it returns, the data
//!   and the metadata describing it are durable. A crash before it may leave the data
//!   written in part (torn) under old metadata: the checksums catch that, and the write
//!   intent lets recovery repair it (see `ChunkMeta.writing`).
//! - `replace` (a clone) is all or nothing: the new data goes to `<h>.tmp` and is synced;
//!   the new metadata is recorded, synced, as a pending replace; the file is renamed over
//!   the old one and the directory synced; then one synced batch makes the metadata
//!   current and drops the pending record. `load` finishes a replace whose rename happened
//!   and undoes one whose rename did not.
//! - `delete` removes the file, syncs the directory, then deletes the metadata synced:
//!   durable when it returns.
//! - A full disk is `NoSpace`.
//!
//! Chunk data moves with direct I/O (`O_DIRECT`) where the file system allows it, as
//! QFS's chunkservers do: the block-aligned part of every write and every read goes
//! between our buffer and the disk without a copy through the page cache. A chunkserver
//! streams far more data than memory holds, so caching it gains little, and filling the
//! page cache is the largest CPU cost of a write (on the test machine, several times
//! the cost of the network copies). The unaligned edges of a write go through the page
//! cache; the kernel keeps the two paths coherent (a direct read first writes back
//! dirty cached pages of its range). `fdatasync` is still what makes data durable: a
//! direct write may sit in the device's volatile cache. Where `O_DIRECT` is refused
//! (tmpfs, some FUSE file systems), everything is buffered.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message;
use tessera_core::error::StoreError;
use tessera_core::pb;
use tessera_core::runtime::{ChunkStore, MetaStore};
use tessera_core::types::ChunkHandle;

use crate::metastore::RocksMetaStore;

const META: &[u8] = b"m/";
const PENDING: &[u8] = b"r/";

fn key(prefix: &[u8], h: ChunkHandle) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&h.to_be_bytes());
    k
}

fn io_err(e: io::Error) -> StoreError {
    if e.raw_os_error() == Some(28) {
        // ENOSPC
        StoreError::NoSpace
    } else {
        StoreError::Io(e.to_string())
    }
}

/// Direct I/O alignment of file offsets, lengths and memory: 4 KiB covers the logical
/// block size of the devices and file systems in use (512 B or 4 KiB).
const ALIGN: u64 = tessera_core::types::IO_ALIGN as u64;

fn o_direct() -> i32 {
    rustix::fs::OFlags::DIRECT.bits() as i32
}

/// Whether a direct-I/O call was refused for its alignment or by the file system.
fn refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(22) // EINVAL
}

/// `data` copied to a buffer that starts on an `ALIGN` boundary: the vector, and where
/// the copy starts in it.
fn aligned_copy(data: &[u8]) -> (Vec<u8>, usize) {
    let mut v: Vec<u8> = Vec::with_capacity(data.len() + ALIGN as usize);
    let pad = v.as_ptr().align_offset(ALIGN as usize);
    v.resize(pad, 0);
    v.extend_from_slice(data);
    (v, pad)
}

/// Writes `data` at `offset` of `file` (open for buffered writes). With `direct` (the
/// same file opened with `O_DIRECT`), the block-aligned middle goes through it and only
/// the edges through the page cache; a refused direct write falls back to buffered.
fn write_at(file: &File, direct: Option<&File>, data: &[u8], offset: u64) -> io::Result<()> {
    let end = offset + data.len() as u64;
    let (a, b) = (offset.next_multiple_of(ALIGN), end / ALIGN * ALIGN);
    let Some(d) = direct.filter(|_| b > a) else {
        return file.write_all_at(data, offset);
    };
    let (head, mid) = ((a - offset) as usize, (b - a) as usize);
    file.write_all_at(&data[..head], offset)?;
    let middle = &data[head..head + mid];
    // Data the chunkserver assembled is aligned already (`IO_ALIGN`); other data is copied.
    let copy;
    let aligned = if middle.as_ptr().align_offset(ALIGN as usize) == 0 {
        middle
    } else {
        let (buf, pad) = aligned_copy(middle);
        copy = buf;
        &copy[pad..]
    };
    match d.write_all_at(aligned, a) {
        Err(e) if refused(&e) => file.write_all_at(&data[head..head + mid], a)?,
        r => r?,
    }
    file.write_all_at(&data[head + mid..], b)
}

/// Reads `[offset, end)` of a file at least `end` long through `direct` (`O_DIRECT`):
/// the enclosing aligned range into an aligned buffer. `None` if the kernel refused.
fn read_direct(direct: &File, offset: u64, end: u64) -> io::Result<Option<Bytes>> {
    let (a, b) = (offset / ALIGN * ALIGN, end.next_multiple_of(ALIGN));
    let want = (b - a) as usize;
    let mut v: Vec<u8> = Vec::with_capacity(want + ALIGN as usize);
    let pad = v.as_ptr().align_offset(ALIGN as usize);
    v.resize(pad + want, 0);
    let mut got = 0;
    while got < want {
        match direct.read_at(&mut v[pad + got..pad + want], a + got as u64) {
            Ok(0) => break,
            // A short read ends at the end of the file (not on a block boundary).
            Ok(n) if !(n as u64).is_multiple_of(ALIGN) => {
                got += n;
                break;
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if refused(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    let (s, e) = ((offset - a) as usize, (end - a) as usize);
    if got < e {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "chunk file shorter than its size",
        ));
    }
    Ok(Some(Bytes::from(v).slice(pad + s..pad + e)))
}

/// Whether files in `dir` can be opened for direct I/O, found by trying.
fn direct_io_works(dir: &Path) -> bool {
    let probe = dir.join(".direct-probe");
    let ok = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(o_direct())
        .open(&probe)
        .and_then(|f| {
            let (buf, pad) = aligned_copy(&[0; ALIGN as usize]);
            f.write_all_at(&buf[pad..], 0)
        })
        .is_ok();
    let _ = fs::remove_file(&probe);
    ok
}

#[derive(Clone)]
pub struct FileChunkStore {
    dir: Arc<PathBuf>,
    meta: RocksMetaStore,
    /// Chunks written since their last sync.
    dirty: Arc<Mutex<HashSet<ChunkHandle>>>,
    /// Whether chunk data moves with direct I/O (the file system allows it).
    direct: bool,
}

impl FileChunkStore {
    /// Opens (creating) the store under `dir`: `dir/chunks/` and `dir/chunkmeta/`.
    pub fn open(dir: &Path) -> Result<FileChunkStore, StoreError> {
        let chunks = dir.join("chunks");
        fs::create_dir_all(&chunks).map_err(io_err)?;
        let meta = RocksMetaStore::open(&dir.join("chunkmeta"))?;
        let direct = direct_io_works(&chunks);
        tracing::info!(dir = %chunks.display(), direct, "chunk files use direct I/O where aligned");
        Ok(FileChunkStore {
            dir: Arc::new(chunks),
            meta,
            dirty: Arc::default(),
            direct,
        })
    }

    /// Whether chunk data moves with direct I/O.
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    /// `path` opened again with `O_DIRECT`, if this store uses it.
    fn open_direct(&self, path: &Path, write: bool) -> Option<File> {
        if !self.direct {
            return None;
        }
        OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(o_direct())
            .open(path)
            .ok()
    }

    fn path(&self, h: ChunkHandle) -> PathBuf {
        self.dir.join(format!("{h:016x}.chunk"))
    }

    fn tmp(&self, h: ChunkHandle) -> PathBuf {
        self.dir.join(format!("{h:016x}.tmp"))
    }

    async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| StoreError::Io(format!("storage task: {e}")))?
    }

    fn sync_dir(dir: &Path) -> Result<(), StoreError> {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_err)
    }
}

impl ChunkStore for FileChunkStore {
    fn read(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send {
        let path = self.path(h);
        let this = self.clone();
        Self::blocking(move || {
            let f = match File::open(&path) {
                Ok(f) => f,
                // A chunk with metadata but no bytes yet has no file.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Bytes::new()),
                Err(e) => return Err(io_err(e)),
            };
            let size = f.metadata().map_err(io_err)?.len();
            let end = offset.saturating_add(len).min(size);
            if offset >= end {
                return Ok(Bytes::new());
            }
            if let Some(d) = this.open_direct(&path, false) {
                match read_direct(&d, offset, end) {
                    Ok(Some(b)) => return Ok(b),
                    Ok(None) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(StoreError::Io(format!(
                            "chunk file {} shorter than its size",
                            path.display()
                        )));
                    }
                    Err(e) => return Err(io_err(e)),
                }
            }
            // Read into spare capacity: no zero-filling a buffer the read overwrites.
            let want = end - offset;
            let mut buf = Vec::with_capacity(want as usize);
            let mut f = f;
            f.seek(io::SeekFrom::Start(offset)).map_err(io_err)?;
            f.take(want).read_to_end(&mut buf).map_err(io_err)?;
            if (buf.len() as u64) < want {
                return Err(StoreError::Io(format!(
                    "chunk file {} shorter than its size",
                    path.display()
                )));
            }
            Ok(Bytes::from(buf))
        })
    }

    fn write(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let path = self.path(h);
        self.dirty.lock().expect("dirty set").insert(h);
        let this = self.clone();
        Self::blocking(move || {
            let f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&path)
                .map_err(io_err)?;
            let before = f.metadata().map_err(io_err)?.len();
            let direct = this.open_direct(&path, true);
            match write_at(&f, direct.as_ref(), &data, offset) {
                Ok(()) => Ok(()),
                Err(e) => {
                    // A write cut short by a full disk may have grown the file: give the
                    // space back, or the bytes no metadata claims would keep it full.
                    if f.metadata().is_ok_and(|m| m.len() > before) {
                        let _ = f.set_len(before);
                    }
                    Err(io_err(e))
                }
            }
        })
    }

    fn write_meta(
        &mut self,
        meta: pb::ChunkMeta,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut store = self.meta.clone();
        async move {
            store
                .write(vec![(
                    key(META, meta.handle),
                    Some(Bytes::from(meta.encode_to_vec())),
                )])
                .await
        }
    }

    fn replace(
        &mut self,
        meta: pb::ChunkMeta,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let h = meta.handle;
        let (path, tmp, dir) = (self.path(h), self.tmp(h), self.dir.clone());
        let store = self.meta.clone();
        let mut store2 = self.meta.clone();
        self.dirty.lock().expect("dirty set").remove(&h);
        let this = self.clone();
        async move {
            let this2 = this.clone();
            Self::blocking({
                let tmp = tmp.clone();
                move || {
                    let f = File::create(&tmp).map_err(io_err)?;
                    let direct = this2.open_direct(&tmp, true);
                    write_at(&f, direct.as_ref(), &data, 0).map_err(io_err)?;
                    f.sync_all().map_err(io_err)
                }
            })
            .await?;
            let encoded = Bytes::from(meta.encode_to_vec());
            store
                .put_synced(key(PENDING, h), Some(encoded.clone()))
                .await?;
            Self::blocking(move || {
                fs::rename(&tmp, &path).map_err(io_err)?;
                Self::sync_dir(&dir)
            })
            .await?;
            store2
                .write(vec![(key(META, h), Some(encoded)), (key(PENDING, h), None)])
                .await?;
            store2.sync().await
        }
    }

    fn sync(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut store = self.meta.clone();
        let data = self.sync_data(h);
        async move {
            data.await?;
            store.sync().await
        }
    }

    fn sync_data(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        // The file alone: the metadata store's log is synced by the `sync` that follows
        // the metadata write.
        let dirty = self.dirty.lock().expect("dirty set").remove(&h);
        let path = self.path(h);
        async move {
            if dirty {
                Self::blocking(move || match File::open(&path) {
                    Ok(f) => f.sync_data().map_err(io_err),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(io_err(e)),
                })
                .await?;
            }
            Ok(())
        }
    }

    fn delete(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (path, tmp, dir) = (self.path(h), self.tmp(h), self.dir.clone());
        let store = self.meta.clone();
        self.dirty.lock().expect("dirty set").remove(&h);
        async move {
            Self::blocking(move || {
                for p in [&path, &tmp] {
                    match fs::remove_file(p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_err(e)),
                    }
                }
                Self::sync_dir(&dir)
            })
            .await?;
            store.put_synced(key(PENDING, h), None).await?;
            store.put_synced(key(META, h), None).await
        }
    }

    fn load(&mut self) -> impl Future<Output = Result<Vec<pb::ChunkMeta>, StoreError>> + Send {
        let mut store = self.meta.clone();
        let this = self.clone();
        async move {
            // Finish or undo replaces a crash interrupted.
            for (k, v) in store.scan(PENDING).await? {
                let Some(h) = k
                    .get(PENDING.len()..)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)
                else {
                    continue;
                };
                let tmp = this.tmp(h);
                if tmp.exists() {
                    let _ = fs::remove_file(&tmp);
                    store.write(vec![(k, None)]).await?;
                } else {
                    store
                        .write(vec![(key(META, h), Some(v)), (k, None)])
                        .await?;
                }
            }
            store.sync().await?;
            let mut out = Vec::new();
            for (k, v) in store.scan(META).await? {
                match pb::ChunkMeta::decode(v) {
                    Ok(m) if k.len() == META.len() + 8 => out.push(m),
                    _ => tracing::warn!(key = ?k, "unreadable chunk metadata; ignoring it"),
                }
            }
            Ok(out)
        }
    }

    fn available_bytes(&self) -> Option<u64> {
        // What an unprivileged writer may still use (f_bavail, not f_bfree: the blocks
        // reserved for root are not ours to count on).
        match rustix::fs::statvfs(self.dir.as_path()) {
            Ok(s) => Some(s.f_bavail.saturating_mul(s.f_frsize)),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read free space");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(h: ChunkHandle, version: u64, data: &[u8]) -> pb::ChunkMeta {
        pb::ChunkMeta {
            handle: h,
            version,
            length: data.len() as u64,
            checksums: tessera_core::chunkserver::checksum::blocks(data),
            writing: None,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn writes_reads_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileChunkStore::open(dir.path()).unwrap();
        s.write(7, 0, Bytes::from_static(b"hello")).await.unwrap();
        s.write(7, 3, Bytes::from_static(b"p!")).await.unwrap();
        s.write_meta(meta(7, 1, b"help!")).await.unwrap();
        s.sync(7).await.unwrap();
        assert_eq!(&s.read(7, 1, 100).await.unwrap()[..], b"elp!");
        assert!(s.read(7, 10, 5).await.unwrap().is_empty());
        drop(s);
        let mut s = FileChunkStore::open(dir.path()).unwrap();
        let metas = s.load().await.unwrap();
        assert_eq!(metas, vec![meta(7, 1, b"help!")]);
        s.delete(7).await.unwrap();
        assert!(s.load().await.unwrap().is_empty());
        assert!(s.read(7, 0, 5).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn aligned_and_unaligned_writes_and_reads_match_a_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileChunkStore::open(dir.path()).unwrap();
        eprintln!("direct I/O: {}", s.direct_io());
        let mut model: Vec<u8> = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let size = 3 * ALIGN * 8;
        for round in 0..200u64 {
            // Offsets and lengths on, near and between block boundaries.
            let pick = |r: u64, n: u64| match r % 3 {
                0 => n / ALIGN * ALIGN,
                1 => n,
                _ => (n / ALIGN * ALIGN).saturating_sub(1),
            };
            let off = pick(next(3), next(size));
            let len = pick(next(3), 1 + next(5 * ALIGN)).max(1);
            let data: Vec<u8> = (0..len).map(|i| (i + round * 7) as u8).collect();
            let bytes = if round % 2 == 0 {
                Bytes::from(data.clone())
            } else {
                // Placed so its block-aligned middle is aligned in memory: written as is.
                let head = (off.next_multiple_of(ALIGN) - off) as usize;
                let mut v: Vec<u8> = Vec::with_capacity(data.len() + 2 * ALIGN as usize);
                let pad = v.as_ptr().wrapping_add(head).align_offset(ALIGN as usize);
                v.resize(pad, 0);
                v.extend_from_slice(&data);
                Bytes::from(v).slice(pad..)
            };
            s.write(1, off, bytes).await.unwrap();
            let end = (off + len) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
            let (roff, rlen) = (next(model.len() as u64 + 10), next(6 * ALIGN));
            let got = s.read(1, roff, rlen).await.unwrap();
            let (a, b) = (
                (roff as usize).min(model.len()),
                ((roff + rlen) as usize).min(model.len()),
            );
            assert_eq!(&got[..], &model[a..b], "round {round}: read {roff}+{rlen}");
        }
        s.sync(1).await.unwrap();
        assert_eq!(&s.read(1, 0, u64::MAX).await.unwrap()[..], &model[..]);
        // A clone's replace takes the same path.
        s.replace(
            meta(2, 1, &model[..model.len() - 3]),
            Bytes::copy_from_slice(&model[..model.len() - 3]),
        )
        .await
        .unwrap();
        assert_eq!(
            &s.read(2, 5, u64::MAX).await.unwrap()[..],
            &model[5..model.len() - 3]
        );
    }

    #[test]
    fn free_space_comes_from_the_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileChunkStore::open(dir.path()).unwrap();
        let free = s.available_bytes().expect("statvfs works on a temp dir");
        let total = rustix::fs::statvfs(dir.path())
            .map(|v| v.f_blocks * v.f_frsize)
            .unwrap();
        assert!(free > 0 && free <= total, "free {free} of {total}");
    }

    #[tokio::test]
    async fn an_interrupted_replace_is_finished_or_undone() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileChunkStore::open(dir.path()).unwrap();
        s.replace(meta(1, 1, b"old"), Bytes::from_static(b"old"))
            .await
            .unwrap();
        // Crash after the pending record, before the rename: undone.
        std::fs::write(s.tmp(1), b"new!").unwrap();
        s.meta
            .put_synced(
                key(PENDING, 1),
                Some(Bytes::from(meta(1, 2, b"new!").encode_to_vec())),
            )
            .await
            .unwrap();
        assert_eq!(s.load().await.unwrap(), vec![meta(1, 1, b"old")]);
        assert_eq!(&s.read(1, 0, 10).await.unwrap()[..], b"old");
        assert!(!s.tmp(1).exists());
        // Crash after the rename, before the metadata: finished.
        std::fs::write(s.path(1), b"new!").unwrap();
        s.meta
            .put_synced(
                key(PENDING, 1),
                Some(Bytes::from(meta(1, 2, b"new!").encode_to_vec())),
            )
            .await
            .unwrap();
        assert_eq!(s.load().await.unwrap(), vec![meta(1, 2, b"new!")]);
        assert!(s.meta.clone().scan(PENDING).await.unwrap().is_empty());
    }
}
