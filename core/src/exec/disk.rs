//! Compiled kernels kept on disk between runs, so that a second run starts without compiling.
//!
//! The folder is `TESSERA_CACHE_DIR`, else `$XDG_CACHE_HOME/tessera`, else
//! `$HOME/.cache/tessera`; `TESSERA_CACHE_DIR` set but empty turns the disk cache off. Each
//! backend names its entries by what makes them valid (device, driver, compiler and source).
//! An entry carries its length and a checksum, and is written through a temporary file and a
//! rename: a torn, truncated or foreign file reads as absent, never as kernels a driver would
//! trust. The cache only ever saves time, so failing to read or write it is never an error.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Marks an entry written by [`DiskCache::store`], with its format's version.
const MAGIC: &[u8; 8] = b"TSRKC001";
/// The magic, the payload's length and its checksum.
const HEADER_BYTES: usize = 8 + 8 + 8;

/// One backend's folder of cached kernels.
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// The cache for `backend` (a subfolder), or `None` where the disk cache is off or no
    /// folder can be named.
    pub fn for_backend(backend: &str) -> Option<DiskCache> {
        let root = root(
            std::env::var_os("TESSERA_CACHE_DIR"),
            std::env::var_os("XDG_CACHE_HOME"),
            std::env::var_os("HOME"),
        )?;
        Some(DiskCache::at(&root.join(backend)))
    }

    /// A cache in `dir`.
    pub fn at(dir: &Path) -> DiskCache {
        DiskCache {
            dir: dir.to_path_buf(),
        }
    }

    /// The path of entry `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Entry `name`'s bytes, if it is present and whole.
    pub fn load(&self, name: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.path(name)).ok()?;
        let (header, payload) = bytes.split_at_checked(HEADER_BYTES)?;
        let field = |i: usize| u64::from_le_bytes(header[8 * i..8 * i + 8].try_into().unwrap());
        let whole =
            &header[..8] == MAGIC && field(1) == payload.len() as u64 && field(2) == fnv1a(payload);
        whole.then(|| payload.to_vec())
    }

    /// Saves `payload` as entry `name`, replacing what was there; false where it could not.
    pub fn store(&self, name: &str, payload: &[u8]) -> bool {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&fnv1a(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        crate::io::write_atomic(&self.path(name), &bytes).is_ok()
    }
}

/// The cache's root folder from the three settings that name it (see the module's docs).
fn root(
    tessera_cache_dir: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    match tessera_cache_dir {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => match xdg_cache_home.filter(|d| !d.is_empty()) {
            Some(dir) => Some(PathBuf::from(dir).join("tessera")),
            None => Some(PathBuf::from(home.filter(|h| !h.is_empty())?).join(".cache/tessera")),
        },
    }
}

/// 64-bit FNV-1a: enough to tell a damaged entry from a whole one (not an adversary's), and
/// to name entries by what they were made from (a kernel's source and compiler).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> DiskCache {
        let dir =
            std::env::temp_dir().join(format!("tessera-disk-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DiskCache::at(&dir)
    }

    #[test]
    fn an_entry_reads_back_as_stored() {
        let cache = scratch("round-trip");
        assert_eq!(cache.load("kernels.bin"), None);
        assert!(cache.store("kernels.bin", b"compiled code"));
        assert_eq!(
            cache.load("kernels.bin").as_deref(),
            Some(&b"compiled code"[..])
        );
        assert!(cache.store("kernels.bin", b"newer"));
        assert_eq!(cache.load("kernels.bin").as_deref(), Some(&b"newer"[..]));
    }

    #[test]
    fn damaged_entries_read_as_absent() {
        let cache = scratch("damaged");
        assert!(cache.store("k", b"compiled code"));
        let path = cache.path("k");
        let whole = std::fs::read(&path).unwrap();
        let truncated = &whole[..whole.len() - 1];
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut foreign = whole.clone();
        foreign[0] = b'X';
        for bad in [truncated, &flipped[..], &foreign[..], &whole[..5], &[][..]] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(cache.load("k"), None, "{bad:?}");
        }
    }

    #[test]
    fn the_folder_follows_the_settings() {
        let set = |s: &str| Some(OsString::from(s));
        let root = |t, x, h| root(t, x, h).map(|p| p.display().to_string());
        assert_eq!(root(set("/c"), set("/x"), set("/h")).as_deref(), Some("/c"));
        assert_eq!(root(set(""), set("/x"), set("/h")), None);
        assert_eq!(
            root(None, set("/x"), set("/h")).as_deref(),
            Some("/x/tessera")
        );
        assert_eq!(
            root(None, set(""), set("/h")).as_deref(),
            Some("/h/.cache/tessera")
        );
        assert_eq!(root(None, None, None), None);
    }
}
