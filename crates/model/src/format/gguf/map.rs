//! The bytes of a GGUF file: mapped read-only from the file, or owned
//! (tests, tools). The unsafe island of the GGUF reader: the map itself.
//!
//! # Safety
//! `memmap2::Mmap::map` is unsafe because the mapped bytes change if the
//! file does. [`Backing::map`] maps a file opened read-only, privately; the
//! contract (as llama.cpp's mmap loading) is that model files are not
//! modified while xtc runs, and every read of the map goes through
//! bounds-checked slices, so a changed file gives wrong numbers, never an
//! out-of-bounds read.
#![allow(unsafe_code)]

/// Where a [`super::Gguf`]'s bytes live.
pub(super) enum Backing {
    /// The file, mapped read-only.
    Map(memmap2::Mmap),
    /// Bytes in memory.
    Owned(Vec<u8>),
}

impl Backing {
    /// Maps `file` (opened read-only) read-only.
    ///
    /// # Errors
    /// The mapping's I/O error.
    pub(super) fn map(file: &std::fs::File) -> std::io::Result<Backing> {
        // SAFETY: the map is read-only and private to this value; the file
        // was opened read-only. Its bytes may still change if another process
        // writes the file while it is mapped (the documented contract: model
        // files are not modified while xtc runs, as with llama.cpp's mmap
        // loading); every read goes through bounds-checked slices of the map.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        Ok(Backing::Map(map))
    }

    /// The bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}
