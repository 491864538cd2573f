//! `MetaStore` on rocksdb: the master's op log and checkpoints, and each chunkserver's
//! chunk metadata.
//!
//! Durability, option by option (the contract is `tessera_core::runtime::MetaStore`):
//! - Writes go to the write-ahead log with `sync = false`: a batch is applied atomically
//!   and visible at once, and costs no disk flush of its own.
//! - `sync` is `flush_wal(true)`: it writes out and fsyncs the WAL, making every batch
//!   written before it durable. The master's driver writes all the records of one round
//!   of events as one batch and syncs once (group commit); a reply that acknowledges a
//!   mutation is released only after that sync returns.
//! - Recovery mode `PointInTime`: after a crash, the WAL is replayed up to the first
//!   incomplete or corrupt record and no further, so what survives is a prefix of the
//!   batches, each whole — never a later batch without an earlier one. (`AbsoluteConsistency`
//!   would refuse to open after an ordinary crash that tore the unsynced tail.)
//! - `manual_wal_flush = false` and the WAL enabled: rocksdb's own buffering never holds a
//!   batch back from `flush_wal`.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rocksdb::{DB, DBRecoveryMode, Direction, IteratorMode, Options, WriteBatch, WriteOptions};
use tessera_core::error::StoreError;
use tessera_core::runtime::MetaStore;

#[derive(Clone)]
pub struct RocksMetaStore {
    db: Arc<DB>,
}

fn io(e: impl std::fmt::Display) -> StoreError {
    let s = e.to_string();
    if s.contains("No space left") {
        StoreError::NoSpace
    } else {
        StoreError::Io(s)
    }
}

impl RocksMetaStore {
    pub fn open(path: &Path) -> Result<RocksMetaStore, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
        opts.set_manual_wal_flush(false);
        // Small metadata, written in batches: keep the memory footprint modest.
        opts.set_max_background_jobs(2);
        let db = DB::open(&opts, path).map_err(io)?;
        Ok(RocksMetaStore { db: Arc::new(db) })
    }

    /// Runs blocking rocksdb work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&DB) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| StoreError::Io(format!("metadata task: {e}")))?
    }

    pub(crate) async fn put_synced(
        &self,
        key: Vec<u8>,
        value: Option<Bytes>,
    ) -> Result<(), StoreError> {
        self.blocking(move |db| {
            let mut wo = WriteOptions::default();
            wo.set_sync(true);
            match value {
                Some(v) => db.put_opt(key, v, &wo),
                None => db.delete_opt(key, &wo),
            }
            .map_err(io)
        })
        .await
    }
}

/// Writes `batch` as one atomic batch to the WAL, without a sync of its own.
fn write_batch(db: &DB, batch: Vec<(Vec<u8>, Option<Bytes>)>) -> Result<(), StoreError> {
    let mut wb = WriteBatch::default();
    for (k, v) in batch {
        match v {
            Some(v) => wb.put(k, v),
            None => wb.delete(k),
        }
    }
    let mut wo = WriteOptions::default();
    wo.set_sync(false);
    wo.disable_wal(false);
    db.write_opt(wb, &wo).map_err(io)
}

impl MetaStore for RocksMetaStore {
    fn write(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Bytes>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let this = self.clone();
        async move { this.blocking(move |db| write_batch(db, batch)).await }
    }

    fn sync(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        let this = self.clone();
        async move { this.blocking(|db| db.flush_wal(true).map_err(io)).await }
    }

    /// One trip to a blocking thread instead of two: the same write, then the same sync.
    fn write_synced(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Bytes>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let this = self.clone();
        async move {
            this.blocking(move |db| {
                write_batch(db, batch)?;
                db.flush_wal(true).map_err(io)
            })
            .await
        }
    }

    fn scan(
        &mut self,
        prefix: &[u8],
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, Bytes)>, StoreError>> + Send {
        let this = self.clone();
        let prefix = prefix.to_vec();
        async move {
            this.blocking(move |db| {
                let mut out = Vec::new();
                for item in db.iterator(IteratorMode::From(&prefix, Direction::Forward)) {
                    let (k, v) = item.map_err(io)?;
                    if !k.starts_with(&prefix) {
                        break;
                    }
                    out.push((k.to_vec(), Bytes::from(v.to_vec())));
                }
                Ok(out)
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_scan_by_prefix_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RocksMetaStore::open(dir.path()).unwrap();
        s.write(vec![
            (b"log/1".to_vec(), Some(Bytes::from_static(b"a"))),
            (b"log/2".to_vec(), Some(Bytes::from_static(b"b"))),
            (b"cp".to_vec(), Some(Bytes::from_static(b"c"))),
        ])
        .await
        .unwrap();
        s.write(vec![(b"log/1".to_vec(), None)]).await.unwrap();
        s.sync().await.unwrap();
        drop(s);
        let mut s = RocksMetaStore::open(dir.path()).unwrap();
        let got = s.scan(b"log/").await.unwrap();
        assert_eq!(got, vec![(b"log/2".to_vec(), Bytes::from_static(b"b"))]);
        assert_eq!(s.scan(b"").await.unwrap().len(), 2);
    }
}
