//! Cache keys and the on-disk form of an entry: a header, then the payload.
//!
//! ```text
//! magic "tilecKC\0" | format u32 | header length u32 | payload length u64
//! | SHA-256 of the payload (32) | key digest (32)
//! | tilec version (u16 length + bytes) | compiler (u32 length + bytes) | payload
//! ```
//!
//! All integers are little endian. An entry is trusted only if every field matches what the
//! reader expects and the payload has exactly the stated length and checksum.

use sha2::{Digest, Sha256};

const MAGIC: [u8; 8] = *b"tilecKC\0";
/// Bumped whenever the header layout changes.
const FORMAT: u32 = 1;
/// Magic, format, header length, payload length, checksum, key.
const FIXED: usize = 8 + 4 + 4 + 8 + 32 + 32;
/// The tilec version written into entries: an entry of another release is not reused.
const TILEC_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What identifies a cache entry: a SHA-256 digest over the kind of entry, tilec's version,
/// the compiler (path, version, flags) and the sources, plus the compiler description kept in
/// the entry's header. Built with [`Key::builder`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    digest: [u8; 32],
    compiler: String,
}

/// Accumulates the parts of a [`Key`]; each part is length-prefixed, so no two different
/// sequences of parts hash alike by concatenation.
pub struct KeyBuilder {
    h: Sha256,
    compiler: String,
}

impl Key {
    /// Starts a key for entries of `kind` (such as `"cpu-library"`) produced by `compiler`: a
    /// description that changes whenever the compiler's output may (its path and version
    /// string, say; flags can go into [`KeyBuilder::part`]).
    pub fn builder(kind: &str, compiler: &str) -> KeyBuilder {
        let b = KeyBuilder {
            h: Sha256::new(),
            compiler: compiler.to_string(),
        };
        b.part(MAGIC)
            .part(FORMAT.to_le_bytes())
            .part(TILEC_VERSION)
            .part(kind)
            .part(compiler)
    }

    /// The entry's file name stem: the first 128 bits of the digest in hex.
    pub fn name(&self) -> String {
        hex(&self.digest[..16])
    }

    /// The compiler description recorded in the entry.
    pub fn compiler(&self) -> &str {
        &self.compiler
    }
}

impl KeyBuilder {
    /// Adds one part (a source, a flag, an architecture name, ...).
    pub fn part(mut self, bytes: impl AsRef<[u8]>) -> KeyBuilder {
        let b = bytes.as_ref();
        self.h.update((b.len() as u64).to_le_bytes());
        self.h.update(b);
        self
    }

    pub fn finish(self) -> Key {
        Key {
            digest: self.h.finalize().into(),
            compiler: self.compiler,
        }
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Why a stored entry was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Shorter than its header says.
    Truncated,
    /// Not written by tilec's cache (no magic).
    NotAnEntry,
    /// Written by a cache of another format version.
    OtherFormat(u32),
    /// A valid entry, but for another key, tilec version or compiler.
    Foreign(&'static str),
    /// The header is inconsistent, bytes follow the payload, or its checksum differs.
    Corrupt(&'static str),
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Truncated => write!(f, "truncated"),
            Rejection::NotAnEntry => write!(f, "not a tilec cache entry"),
            Rejection::OtherFormat(v) => write!(f, "cache format {v}, expected {FORMAT}"),
            Rejection::Foreign(what) => write!(f, "an entry for another {what}"),
            Rejection::Corrupt(what) => write!(f, "corrupt ({what})"),
        }
    }
}

/// The bytes of an entry for `key` holding `payload`.
pub fn encode(key: &Key, payload: &[u8]) -> Vec<u8> {
    let v = TILEC_VERSION.as_bytes();
    let c = key.compiler.as_bytes();
    let header_len = FIXED + 2 + v.len() + 4 + c.len();
    let mut out = Vec::with_capacity(header_len + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(header_len as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(&key.digest);
    out.extend_from_slice(&(v.len() as u16).to_le_bytes());
    out.extend_from_slice(v);
    out.extend_from_slice(&(c.len() as u32).to_le_bytes());
    out.extend_from_slice(c);
    debug_assert_eq!(out.len(), header_len);
    out.extend_from_slice(payload);
    out
}

/// Checks that `bytes` is an intact entry for `key` and returns its payload.
pub fn decode<'a>(key: &Key, bytes: &'a [u8]) -> Result<&'a [u8], Rejection> {
    let mut r = Reader { b: bytes, at: 0 };
    let magic = r
        .take(8)
        .ok_or(if bytes.len() < 8 && MAGIC.starts_with(bytes) {
            Rejection::Truncated
        } else {
            Rejection::NotAnEntry
        })?;
    if magic != MAGIC {
        return Err(Rejection::NotAnEntry);
    }
    let format = r.u32().ok_or(Rejection::Truncated)?;
    if format != FORMAT {
        return Err(Rejection::OtherFormat(format));
    }
    let header_len = r.u32().ok_or(Rejection::Truncated)? as usize;
    let payload_len = r.u64().ok_or(Rejection::Truncated)?;
    let checksum = r.take(32).ok_or(Rejection::Truncated)?;
    let digest = r.take(32).ok_or(Rejection::Truncated)?;
    let vlen = r.u16().ok_or(Rejection::Truncated)? as usize;
    let version = r.take(vlen).ok_or(Rejection::Truncated)?;
    let clen = r.u32().ok_or(Rejection::Truncated)? as usize;
    let compiler = r.take(clen).ok_or(Rejection::Truncated)?;
    if r.at != header_len {
        return Err(Rejection::Corrupt("header length"));
    }
    let rest = (bytes.len() - header_len) as u64;
    if rest < payload_len {
        return Err(Rejection::Truncated);
    }
    if rest > payload_len {
        return Err(Rejection::Corrupt("bytes after the payload"));
    }
    if digest != key.digest {
        return Err(Rejection::Foreign("key"));
    }
    if version != TILEC_VERSION.as_bytes() {
        return Err(Rejection::Foreign("tilec version"));
    }
    if compiler != key.compiler.as_bytes() {
        return Err(Rejection::Foreign("compiler"));
    }
    let payload = &bytes[header_len..];
    if Sha256::digest(payload).as_slice() != checksum {
        return Err(Rejection::Corrupt("checksum mismatch"));
    }
    Ok(payload)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Some(u64::from_le_bytes(a))
    }
}
