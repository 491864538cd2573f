//! Errors that cross the wire. Each maps one-to-one onto `pb::ErrorCode`.

use crate::pb;

/// A failed file-system operation, as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("not a directory: {0}")]
    NotADirectory(String),
    #[error("is a directory: {0}")]
    IsADirectory(String),
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("stale chunk version: {0}")]
    StaleVersion(String),
    #[error("chunk not found: {0}")]
    ChunkNotFound(String),
    #[error("checksum mismatch: {0}")]
    Corrupt(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("unavailable, retry later: {0}")]
    Unavailable(String),
    #[error("storage error: {0}")]
    Io(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The master replica asked does not lead its group; the address of the one it
    /// believes does ("" if it knows none yet: an election is under way).
    #[error("not the master group's leader (leader: {})", if .0.is_empty() { "unknown" } else { .0.as_str() })]
    NotLeader(String),
    /// The caller's identity (its certificate's role and name, `crate::auth`) does not
    /// allow the request. Asking again as the same caller fails the same way.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
}

impl FsError {
    pub fn to_pb(&self) -> pb::Error {
        use FsError::*;
        let (code, msg) = match self {
            NotFound(m) => (pb::ErrorCode::NotFound, m),
            AlreadyExists(m) => (pb::ErrorCode::AlreadyExists, m),
            NotADirectory(m) => (pb::ErrorCode::NotADirectory, m),
            IsADirectory(m) => (pb::ErrorCode::IsADirectory, m),
            NotEmpty(m) => (pb::ErrorCode::NotEmpty, m),
            InvalidArgument(m) => (pb::ErrorCode::InvalidArgument, m),
            StaleVersion(m) => (pb::ErrorCode::StaleVersion, m),
            ChunkNotFound(m) => (pb::ErrorCode::ChunkNotFound, m),
            Corrupt(m) => (pb::ErrorCode::Corrupt, m),
            NoSpace(m) => (pb::ErrorCode::NoSpace, m),
            Unavailable(m) => (pb::ErrorCode::Unavailable, m),
            Io(m) => (pb::ErrorCode::Io, m),
            Internal(m) => (pb::ErrorCode::Internal, m),
            PermissionDenied(m) => (pb::ErrorCode::PermissionDenied, m),
            NotLeader(leader) => {
                return pb::Error {
                    code: pb::ErrorCode::NotLeader as i32,
                    message: self.to_string(),
                    leader: leader.clone(),
                };
            }
        };
        pb::Error {
            code: code as i32,
            message: msg.clone(),
            leader: String::new(),
        }
    }

    /// Decodes an error from a reply. An unknown code (a newer peer) becomes `Internal`
    /// with the code kept in the message, so nothing is silently dropped.
    pub fn from_pb(e: &pb::Error) -> FsError {
        use FsError::*;
        let m = e.message.clone();
        match pb::ErrorCode::try_from(e.code) {
            Ok(pb::ErrorCode::NotFound) => NotFound(m),
            Ok(pb::ErrorCode::AlreadyExists) => AlreadyExists(m),
            Ok(pb::ErrorCode::NotADirectory) => NotADirectory(m),
            Ok(pb::ErrorCode::IsADirectory) => IsADirectory(m),
            Ok(pb::ErrorCode::NotEmpty) => NotEmpty(m),
            Ok(pb::ErrorCode::InvalidArgument) => InvalidArgument(m),
            Ok(pb::ErrorCode::StaleVersion) => StaleVersion(m),
            Ok(pb::ErrorCode::ChunkNotFound) => ChunkNotFound(m),
            Ok(pb::ErrorCode::Corrupt) => Corrupt(m),
            Ok(pb::ErrorCode::NoSpace) => NoSpace(m),
            Ok(pb::ErrorCode::Unavailable) => Unavailable(m),
            Ok(pb::ErrorCode::Io) => Io(m),
            Ok(pb::ErrorCode::Internal) => Internal(m),
            Ok(pb::ErrorCode::NotLeader) => NotLeader(e.leader.clone()),
            Ok(pb::ErrorCode::PermissionDenied) => PermissionDenied(m),
            Ok(pb::ErrorCode::Unspecified) | Err(_) => {
                Internal(format!("error code {}: {}", e.code, m))
            }
        }
    }

    /// The same error with its message passed through `f` (a leader's address is not a
    /// message and stays as it is).
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> FsError {
        use FsError::*;
        match self {
            NotFound(m) => NotFound(f(m)),
            AlreadyExists(m) => AlreadyExists(f(m)),
            NotADirectory(m) => NotADirectory(f(m)),
            IsADirectory(m) => IsADirectory(f(m)),
            NotEmpty(m) => NotEmpty(f(m)),
            InvalidArgument(m) => InvalidArgument(f(m)),
            StaleVersion(m) => StaleVersion(f(m)),
            ChunkNotFound(m) => ChunkNotFound(f(m)),
            Corrupt(m) => Corrupt(f(m)),
            NoSpace(m) => NoSpace(f(m)),
            Unavailable(m) => Unavailable(f(m)),
            Io(m) => Io(f(m)),
            Internal(m) => Internal(f(m)),
            PermissionDenied(m) => PermissionDenied(f(m)),
            NotLeader(l) => NotLeader(l),
        }
    }

    /// Whether asking again (possibly elsewhere) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            FsError::Unavailable(_)
                | FsError::StaleVersion(_)
                | FsError::Corrupt(_)
                | FsError::ChunkNotFound(_)
                | FsError::Io(_)
                | FsError::NotLeader(_)
        )
    }
}

/// A failed call at the transport level: the request may or may not have been applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    #[error("deadline exceeded calling {0}")]
    Deadline(String),
    #[error("cannot reach {0}")]
    Unreachable(String),
    #[error("malformed message: {0}")]
    Decode(String),
    #[error("message too large: {0} bytes")]
    TooLarge(usize),
    /// A server could not take its address (in use, not this machine's, no permission).
    #[error("cannot listen on {0}")]
    Listen(String),
}

/// A storage operation that failed on a chunkserver's disk or the master's metadata store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("disk full")]
    NoSpace,
    #[error("not found")]
    NotFound,
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("i/o error: {0}")]
    Io(String),
}

impl From<StoreError> for FsError {
    fn from(e: StoreError) -> FsError {
        match e {
            StoreError::NoSpace => FsError::NoSpace("disk full".into()),
            StoreError::NotFound => FsError::ChunkNotFound("chunk missing on disk".into()),
            StoreError::Corrupt(m) => FsError::Corrupt(m),
            StoreError::Io(m) => FsError::Io(m),
        }
    }
}
