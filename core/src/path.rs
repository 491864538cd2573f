//! Path names: absolute, `/`-separated, no empty, `.` or `..` components.

use crate::error::FsError;

/// Longest component, in bytes (as most local file systems).
pub const MAX_NAME: usize = 255;
/// Longest full path, in bytes.
pub const MAX_PATH: usize = 4096;

/// Splits an absolute path into its components, rejecting anything malformed.
/// `/` has no components.
pub fn components(path: &str) -> Result<Vec<&str>, FsError> {
    let bad = |why: &str| Err(FsError::InvalidArgument(format!("path {path:?}: {why}")));
    if !path.starts_with('/') {
        return bad("must be absolute");
    }
    if path.len() > MAX_PATH {
        return bad("too long");
    }
    if path == "/" {
        return Ok(Vec::new());
    }
    let rest = path.strip_suffix('/').unwrap_or(path);
    let mut out = Vec::new();
    for c in rest[1..].split('/') {
        if c.is_empty() {
            return bad("empty component");
        }
        if c == "." || c == ".." {
            return bad("`.` and `..` are not allowed");
        }
        if c.len() > MAX_NAME {
            return bad("component too long");
        }
        if c.contains('\0') {
            return bad("contains NUL");
        }
        out.push(c);
    }
    Ok(out)
}

/// The path with a trailing slash removed (`/` stays `/`).
pub fn normalize(path: &str) -> Result<String, FsError> {
    let c = components(path)?;
    Ok(join(&c))
}

pub fn join(components: &[&str]) -> String {
    if components.is_empty() {
        return "/".to_string();
    }
    let mut s = String::new();
    for c in components {
        s.push('/');
        s.push_str(c);
    }
    s
}

/// `/`, `/a`, `/a/b` for `/a/b/c`: every proper ancestor, root first.
pub fn ancestors(path: &str) -> Result<Vec<String>, FsError> {
    let c = components(path)?;
    Ok((0..c.len()).map(|i| join(&c[..i])).collect())
}

/// Splits into (parent path, last component). `/` has no parent.
pub fn split_last(path: &str) -> Result<(String, String), FsError> {
    let c = components(path)?;
    match c.split_last() {
        Some((last, parent)) => Ok((join(parent), (*last).to_string())),
        None => Err(FsError::InvalidArgument(
            "/ is the root directory: it cannot be made, moved, replaced or removed".into(),
        )),
    }
}

/// Whether `inner` is `outer` or lies below it.
pub fn is_within(inner: &str, outer: &str) -> bool {
    outer == "/"
        || inner == outer
        || (inner.starts_with(outer) && inner.as_bytes().get(outer.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed() {
        for p in ["", "a", "//", "/a//b", "/a/./b", "/a/../b", "/a\0"] {
            assert!(components(p).is_err(), "{p:?} accepted");
        }
        assert!(components(&format!("/{}", "x".repeat(256))).is_err());
    }

    #[test]
    fn splits_and_joins() {
        assert_eq!(components("/").unwrap(), Vec::<&str>::new());
        assert_eq!(components("/a/b/").unwrap(), vec!["a", "b"]);
        assert_eq!(normalize("/a/b/").unwrap(), "/a/b");
        assert_eq!(ancestors("/a/b/c").unwrap(), vec!["/", "/a", "/a/b"]);
        assert_eq!(
            split_last("/a/b").unwrap(),
            ("/a".to_string(), "b".to_string())
        );
        assert!(is_within("/a/b", "/a"));
        assert!(!is_within("/ab", "/a"));
        assert!(is_within("/a", "/"));
    }
}
