//! Bounded reading of kernel attribute files and the kernel's list format
//! (`0-3,8-11`): what the [`Executor`](super::Executor) needs to read the
//! NUMA topology (`/sys/devices/system/node/nodeN/cpulist`), and what
//! `accel`'s device probe reuses for its own attributes.
//!
//! They live in the runtime because the runtime reads topology and must know
//! no devices (`rt` imports nothing above it); `accel` re-exports them
//! (`accel::sysfs::parse_cpulist`, `accel::node::read_attr_file`).
//!
//! Both are bounded whatever the bytes: [`read_attr_file`] opens without
//! blocking, refuses anything but a regular file and reads at most
//! [`MAX_ATTR_BYTES`]; [`parse_cpulist`] refuses ids at or beyond
//! [`MAX_LIST_ID`] instead of allocating for them (a garbage
//! `0-4294967295` must not exhaust memory). Neither panics.
//!
//! [`MemoryFiles`] reads, the same bounded way, what memory the process can
//! still get: `/proc/meminfo`'s `MemAvailable`, `/proc/self/status`'s
//! `VmSize` / `VmData`, and the cgroup v2 `memory.max` less
//! `memory.current` (`xtc decode`'s memory check), under a root a test can
//! point at a fixture tree.
//!
//! Kernel references: `Documentation/ABI/stable/sysfs-devices-node` (online,
//! cpulist), `Documentation/ABI/testing/sysfs-bus-pci` (local_cpulist),
//! `Documentation/filesystems/proc.rst` (meminfo, status) and
//! `Documentation/admin-guide/cgroup-v2.rst` (memory.max, memory.current).

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest CPU or node number a list may name. Larger values are rejected
/// rather than allocated (a garbage `0-4294967295` must not exhaust memory).
pub const MAX_LIST_ID: u32 = 1 << 16;

/// Bytes read from one attribute at most (a sysfs attribute is one page).
pub const MAX_ATTR_BYTES: u64 = 4096;

/// Why an attribute's text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The attribute was empty (or only whitespace).
    #[error("empty")]
    Empty,
    /// The text is not of the attribute's form; carries the text (trimmed, at most 64 chars).
    #[error("unparsable {0:?}")]
    Garbage(String),
    /// A number beyond what the attribute may hold ([`MAX_LIST_ID`] for lists).
    #[error("out of range {0:?}")]
    OutOfRange(String),
}

/// [`ParseError::Garbage`] carrying at most 64 characters of `s`.
pub(crate) fn garbage(s: &str) -> ParseError {
    ParseError::Garbage(s.chars().take(64).collect())
}

/// Parses a kernel list such as `0-3,8,10-11` (cpulist, node `online`) into
/// sorted, deduplicated ids. An empty or whitespace-only text is the empty
/// list (a memory-only node has an empty `cpulist`).
///
/// # Errors
/// [`ParseError::Garbage`] for a malformed item or a reversed range,
/// [`ParseError::OutOfRange`] for an id at or beyond [`MAX_LIST_ID`].
pub fn parse_cpulist(text: &str) -> Result<Vec<u32>, ParseError> {
    let t = text.trim();
    let mut ids = Vec::new();
    if t.is_empty() {
        return Ok(ids);
    }
    for item in t.split(',') {
        let (lo, hi) = parse_range(item.trim(), t)?;
        ids.extend(lo..=hi);
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

fn parse_range(item: &str, whole: &str) -> Result<(u32, u32), ParseError> {
    let (lo, hi) = match item.split_once('-') {
        Some((a, b)) => (parse_id(a, whole)?, parse_id(b, whole)?),
        None => {
            let v = parse_id(item, whole)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(garbage(whole));
    }
    Ok((lo, hi))
}

fn parse_id(s: &str, whole: &str) -> Result<u32, ParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(garbage(whole));
    }
    match s.parse::<u32>() {
        Ok(v) if v < MAX_LIST_ID => Ok(v),
        _ => Err(ParseError::OutOfRange(whole.chars().take(64).collect())),
    }
}

/// Reads one attribute file at `path` (at most [`MAX_ATTR_BYTES`]) as text;
/// `Ok(None)` when it does not exist. The open is non-blocking and anything
/// but a regular file is refused (sysfs attributes are regular files), so a
/// FIFO, a socket or a device node in a fixture tree is an error, never an
/// open or read that blocks.
///
/// # Errors
/// `InvalidInput` ("not a regular file") for a directory, FIFO or device
/// node; `InvalidData` for non-UTF-8 bytes; other I/O errors as they come.
pub fn read_attr_file(path: &Path) -> io::Result<Option<String>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ATTR_BYTES).read_to_end(&mut bytes)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "attribute is not UTF-8"))
}

/// The memory files of a system under `root` (`/` on a live one; a fixture
/// tree in tests), each read with [`read_attr_file`]. A file that is
/// missing, unreadable or malformed reads as `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFiles {
    root: PathBuf,
}

impl MemoryFiles {
    /// The running system's files.
    pub fn live() -> Self {
        MemoryFiles::at("/")
    }

    /// The files under `root` (`root/proc/meminfo`, `root/sys/fs/cgroup/...`).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        MemoryFiles { root: root.into() }
    }

    fn read(&self, rel: &str) -> Option<String> {
        read_attr_file(&self.root.join(rel)).ok().flatten()
    }

    /// `MemAvailable` of `/proc/meminfo`, in bytes (`MemFree` on kernels
    /// before 3.14, which lack it).
    pub fn mem_available(&self) -> Option<u128> {
        mem_available(&self.read("proc/meminfo")?)
    }

    /// A `Field:   N kB` line of `/proc/self/status` (`VmSize:`,
    /// `VmData:`), in bytes.
    pub fn self_status(&self, field: &str) -> Option<u128> {
        proc_kib(&self.read("proc/self/status")?, field)
    }

    /// `memory.max - memory.current` of this process's cgroup (v2, from
    /// `/proc/self/cgroup`'s `0::` line), when it has a limit (`max` is
    /// none).
    pub fn cgroup_left(&self) -> Option<u128> {
        let cg = self.read("proc/self/cgroup")?;
        let rel = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = Path::new("sys/fs/cgroup").join(rel.trim().trim_start_matches('/'));
        // A path that climbs out of the cgroup tree is not a cgroup.
        if dir
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return None;
        }
        let num =
            |f: &str| -> Option<u128> { self.read(dir.join(f).to_str()?)?.trim().parse().ok() };
        let max = num("memory.max")?;
        let cur = num("memory.current")?;
        Some(max.saturating_sub(cur))
    }
}

/// `MemAvailable` of `/proc/meminfo` text, in bytes (`MemFree` on kernels
/// before 3.14, which lack it).
pub fn mem_available(meminfo: &str) -> Option<u128> {
    proc_kib(meminfo, "MemAvailable:").or_else(|| proc_kib(meminfo, "MemFree:"))
}

/// A `Field:   N kB` line of a `/proc` file, in bytes.
pub fn proc_kib(text: &str, field: &str) -> Option<u128> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Ok(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("\n"), Ok(vec![]));
        assert_eq!(parse_cpulist("5,1-2,2"), Ok(vec![1, 2, 5]));
        assert!(matches!(parse_cpulist("3-1"), Err(ParseError::Garbage(_))));
        assert!(matches!(parse_cpulist("0-"), Err(ParseError::Garbage(_))));
        assert!(matches!(parse_cpulist("a"), Err(ParseError::Garbage(_))));
        assert!(matches!(parse_cpulist("0,,1"), Err(ParseError::Garbage(_))));
        assert!(matches!(
            parse_cpulist("0-4294967295"),
            Err(ParseError::OutOfRange(_))
        ));
    }

    #[test]
    fn attribute_reads_are_bounded_and_refuse_non_files() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        fs::write(&big, vec![b'7'; 3 * MAX_ATTR_BYTES as usize]).unwrap();
        let text = read_attr_file(&big).unwrap().unwrap();
        assert_eq!(text.len() as u64, MAX_ATTR_BYTES, "one page at most");
        assert_eq!(read_attr_file(&dir.path().join("none")).unwrap(), None);
        let e = read_attr_file(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "a directory");
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let e = read_attr_file(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "a FIFO never blocks");
    }

    #[test]
    fn memory_files_read_from_an_injected_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = MemoryFiles::at(root);
        assert_eq!(files.mem_available(), None, "nothing there");
        assert_eq!(files.cgroup_left(), None);
        fs::create_dir_all(root.join("proc/self")).unwrap();
        fs::write(
            root.join("proc/meminfo"),
            "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    600 kB\n",
        )
        .unwrap();
        fs::write(
            root.join("proc/self/status"),
            "Name:\txtc\nVmSize:\t  2048 kB\n",
        )
        .unwrap();
        assert_eq!(files.mem_available(), Some(600 * 1024));
        assert_eq!(files.self_status("VmSize:"), Some(2048 * 1024));
        assert_eq!(files.self_status("VmData:"), None);
        fs::write(root.join("proc/self/cgroup"), "0::/user.slice/x.scope\n").unwrap();
        let cg = root.join("sys/fs/cgroup/user.slice/x.scope");
        fs::create_dir_all(&cg).unwrap();
        fs::write(cg.join("memory.max"), "max\n").unwrap();
        fs::write(cg.join("memory.current"), "4096\n").unwrap();
        assert_eq!(files.cgroup_left(), None, "no limit");
        fs::write(cg.join("memory.max"), "10000\n").unwrap();
        assert_eq!(files.cgroup_left(), Some(10000 - 4096));
        fs::write(root.join("proc/self/cgroup"), "0::/../../etc\n").unwrap();
        assert_eq!(files.cgroup_left(), None, "no climbing out");
        assert_eq!(
            mem_available("MemFree: 5 kB\n"),
            Some(5 * 1024),
            "old kernels"
        );
    }
}
