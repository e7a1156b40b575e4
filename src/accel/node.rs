//! Render and accel nodes: names, device numbers, and reading sysfs under an
//! injectable root.
//!
//! A *render node* is `/dev/dri/renderD<minor>` (DRM major 226, minors from
//! 128; `Documentation/gpu/drm-uapi.rst`); an *accel node* is
//! `/dev/accel/accel<minor>` (the compute-accelerator class, major 261,
//! `Documentation/accel/introduction.rst`). Both answer the DRM core ioctls,
//! so `DRM_IOCTL_VERSION` gives the driver name on either.
//!
//! Every path is resolved under a root directory ([`Rooted`]), so tests run on
//! the fixture trees in `devices/`. Symlinks are followed by hand: an absolute
//! target is re-rooted, `..` never climbs above the root, and more than
//! [`MAX_SYMLINK_HOPS`] links (a loop) is an `ELOOP` error, never a hang.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Major number of DRM character devices (`DRM_MAJOR`).
pub const DRM_MAJOR: u32 = 226;
/// Major number of compute-accelerator devices (`ACCEL_MAJOR`).
pub const ACCEL_MAJOR: u32 = 261;
/// First minor of DRM render nodes (`renderD128`).
pub const RENDER_MINOR_BASE: u32 = 128;
/// Symlinks followed while resolving one path before giving up with `ELOOP`
/// (the kernel's own limit, `MAXSYMLINKS`).
pub const MAX_SYMLINK_HOPS: u32 = 40;
// Bounded, non-blocking attribute reads live in the runtime (its executor
// reads NUMA cpulists and must know no devices); re-exported here.
pub use crate::rt::sysfs::{MAX_ATTR_BYTES, read_attr_file};

/// Kind of a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A DRM render node, `/dev/dri/renderD*` (sysfs class `drm`).
    Render,
    /// A compute-accelerator node, `/dev/accel/accel*` (sysfs class `accel`).
    Accel,
}

impl NodeKind {
    /// Directory of this kind's nodes, relative to the root (`dev/dri`).
    pub fn dev_dir(self) -> &'static str {
        match self {
            NodeKind::Render => "dev/dri",
            NodeKind::Accel => "dev/accel",
        }
    }

    /// Sysfs class directory, relative to the root (`sys/class/drm`).
    pub fn class_dir(self) -> &'static str {
        match self {
            NodeKind::Render => "sys/class/drm",
            NodeKind::Accel => "sys/class/accel",
        }
    }

    /// File-name prefix of this kind's nodes (`renderD`, `accel`).
    pub fn prefix(self) -> &'static str {
        match self {
            NodeKind::Render => "renderD",
            NodeKind::Accel => "accel",
        }
    }

    /// `"a render"` / `"an accel"`, for messages.
    pub fn article_name(self) -> &'static str {
        match self {
            NodeKind::Render => "a render",
            NodeKind::Accel => "an accel",
        }
    }

    /// Character-device major number of this kind.
    pub fn major(self) -> u32 {
        match self {
            NodeKind::Render => DRM_MAJOR,
            NodeKind::Accel => ACCEL_MAJOR,
        }
    }
}

/// Splits a short node name into its kind and number: `renderD128` ->
/// `(Render, 128)`, `accel0` -> `(Accel, 0)`. Returns `None` for any other
/// name (`card0`, `renderD`, `accel-1`, `../x`, and `renderD0128`: the
/// kernel writes the number without leading zeros, so the name rebuilt from
/// the pair is always the name parsed), so a name from outside can never be
/// used to build a path that leaves the class directory.
pub fn parse_node_name(name: &str) -> Option<(NodeKind, u32)> {
    for kind in [NodeKind::Render, NodeKind::Accel] {
        let Some(digits) = name.strip_prefix(kind.prefix()) else {
            continue;
        };
        if digits.is_empty()
            || digits.len() > 7
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || (digits.len() > 1 && digits.starts_with('0'))
        {
            return None;
        }
        let n: u32 = digits.parse().ok()?;
        if kind == NodeKind::Render && n < RENDER_MINOR_BASE {
            return None;
        }
        return Some((kind, n));
    }
    None
}

/// A filesystem view rooted at a directory (`/` for the live system, a
/// `devices/<fixture>` tree in tests). Relative paths given to its methods
/// are resolved inside the root.
#[derive(Debug, Clone)]
pub struct Rooted {
    root: PathBuf,
}

impl Rooted {
    /// A view rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Rooted {
        Rooted { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `rel` (relative to the root) following every symlink inside
    /// the root, including the last component. A missing component ends the
    /// walk: the rest is appended unresolved, so the caller's open reports
    /// `NotFound`.
    ///
    /// # Errors
    /// `ELOOP` (`io::Error::from_raw_os_error(40)`) after
    /// [`MAX_SYMLINK_HOPS`] links; other I/O errors of `lstat`/`readlink`.
    pub fn resolve(&self, rel: impl AsRef<Path>) -> io::Result<PathBuf> {
        let mut todo: VecDeque<OsString> = components(rel.as_ref()).collect();
        let mut cur: Vec<OsString> = Vec::new();
        let mut hops = 0;
        while let Some(c) = todo.pop_front() {
            if c == ".." {
                cur.pop();
                continue;
            }
            cur.push(c);
            let here = self.join(&cur);
            let meta = match fs::symlink_metadata(&here) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    cur.extend(todo);
                    return Ok(self.join(&cur));
                }
                Err(e) => return Err(e),
            };
            if !meta.file_type().is_symlink() {
                continue;
            }
            hops += 1;
            if hops > MAX_SYMLINK_HOPS {
                return Err(io::Error::from_raw_os_error(40)); // ELOOP
            }
            let target = fs::read_link(&here)?;
            cur.pop();
            if target.is_absolute() {
                cur.clear();
            }
            for t in components(&target).rev() {
                todo.push_front(t);
            }
        }
        Ok(self.join(&cur))
    }

    fn join(&self, parts: &[OsString]) -> PathBuf {
        let mut p = self.root.clone();
        p.extend(parts);
        p
    }

    /// Reads one attribute (at most [`MAX_ATTR_BYTES`]) as text.
    /// `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// `ELOOP` for a symlink loop, `InvalidData` for non-UTF-8 bytes, other
    /// I/O errors as they come (e.g. `EISDIR`).
    pub fn read_attr(&self, rel: impl AsRef<Path>) -> io::Result<Option<String>> {
        read_attr_file(&self.resolve(rel)?)
    }

    /// The last component of a symlink's target without following it (how
    /// `device/driver -> ../../../bus/pci/drivers/nvidia` names its driver).
    /// `Ok(None)` when `rel` does not exist.
    ///
    /// # Errors
    /// `EINVAL` when `rel` is not a symlink; errors resolving its parent.
    pub fn link_name(&self, rel: impl AsRef<Path>) -> io::Result<Option<String>> {
        let rel = rel.as_ref();
        let parent = self.resolve(rel.parent().unwrap_or(Path::new("")))?;
        let Some(name) = rel.file_name() else {
            return Ok(None);
        };
        match fs::read_link(parent.join(name)) {
            Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// File names in a directory, sorted; empty when it does not exist.
    ///
    /// # Errors
    /// I/O errors other than `NotFound` (e.g. `ENOTDIR`, `EACCES`, `ELOOP`).
    pub fn list_dir(&self, rel: impl AsRef<Path>) -> io::Result<Vec<String>> {
        let path = self.resolve(rel)?;
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in entries {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }
}

fn components(p: &Path) -> impl DoubleEndedIterator<Item = OsString> + '_ {
    p.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some(OsString::from("..")),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

/// What opening a node found.
#[derive(Debug)]
pub enum Opened {
    /// A character device of the expected major, open read+write.
    Node(NodeFile),
    /// Could not be used; the text says why (`missing: ...`,
    /// `permission denied: ...`, `not a character device: ...`).
    Failed(String),
}

/// An open render/accel node; implements [`drm::Device`] so the DRM core
/// ioctls (`DRM_IOCTL_VERSION`) can be issued on it.
#[derive(Debug)]
pub struct NodeFile(File);

impl AsFd for NodeFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl drm::Device for NodeFile {}

/// Render nodes accept the syncobj ioctls (`DRM_RENDER_ALLOW`), which live on
/// `drm::control::Device` in the `drm` crate; this gives a sync_file source
/// on device machines (`syncobj_to_fd(handle, true)`).
impl drm::control::Device for NodeFile {}

impl NodeFile {
    /// The driver name from `DRM_IOCTL_VERSION`.
    ///
    /// # Errors
    /// The ioctl's error (e.g. `ENOTTY` on a character device that is no DRM node).
    pub fn driver_name(&self) -> io::Result<String> {
        use drm::Device as _;
        let drv = self.get_driver()?;
        Ok(drv.name().to_string_lossy().into_owned())
    }
}

/// Opens the node at `dev_path` (logical, e.g. `/dev/dri/renderD128`) under
/// `fs`'s root, checking it is a character device of `kind`'s major. Never
/// fails: a node that cannot be used comes back as [`Opened::Failed`] with the
/// reason, so one bad node does not fail the whole probe.
pub fn open_node(fs: &Rooted, dev_path: &Path, kind: NodeKind) -> Opened {
    let shown = dev_path.display();
    let path = match fs.resolve(dev_path) {
        Ok(p) => p,
        Err(e) => return Opened::Failed(format!("unresolvable: {shown}: {e}")),
    };
    let meta = match fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => return Opened::Failed(describe_open_error(&shown.to_string(), &e)),
    };
    if !meta.file_type().is_char_device() {
        return Opened::Failed(format!("not a character device: {shown}"));
    }
    let major = rustix::fs::major(std::os::unix::fs::MetadataExt::rdev(&meta));
    if major != kind.major() {
        return Opened::Failed(format!(
            "not {} node: {shown} has major {major}, expected {}",
            kind.article_name(),
            kind.major()
        ));
    }
    match fs::OpenOptions::new().read(true).write(true).open(&path) {
        Ok(f) => Opened::Node(NodeFile(f)),
        Err(e) => Opened::Failed(describe_open_error(&shown.to_string(), &e)),
    }
}

/// The reason text for a failed `stat`/`open` of a node: `missing: <path>`,
/// `permission denied: <path>`, or `open failed: <path>: <error>`.
pub fn describe_open_error(path: &str, err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::NotFound => format!("missing: {path}"),
        io::ErrorKind::PermissionDenied => format!("permission denied: {path}"),
        _ => format!("open failed: {path}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn node_names() {
        assert_eq!(parse_node_name("renderD128"), Some((NodeKind::Render, 128)));
        assert_eq!(parse_node_name("accel0"), Some((NodeKind::Accel, 0)));
        for bad in [
            "card0",
            "renderD",
            "renderD12",
            "accel",
            "accel-1",
            "../x",
            "renderD1a",
            "",
        ] {
            assert_eq!(parse_node_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn resolve_stays_under_root_and_stops_loops() {
        let dir = tempfile::tempdir().unwrap();
        let fs_ = Rooted::new(dir.path());
        fs::create_dir_all(dir.path().join("a/b")).unwrap();
        fs::write(dir.path().join("a/b/f"), "x").unwrap();
        symlink("/a/b", dir.path().join("abs")).unwrap();
        symlink("../../../../../a", dir.path().join("a/b/up")).unwrap();
        symlink("loop2", dir.path().join("loop1")).unwrap();
        symlink("loop1", dir.path().join("loop2")).unwrap();
        assert_eq!(fs_.read_attr("abs/f").unwrap().as_deref(), Some("x"));
        assert_eq!(fs_.read_attr("a/b/up/b/f").unwrap().as_deref(), Some("x"));
        assert_eq!(fs_.read_attr("a/nope").unwrap(), None);
        let e = fs_.read_attr("loop1/x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(40));
        assert_eq!(fs_.list_dir("nope").unwrap(), Vec::<String>::new());
        assert_eq!(fs_.link_name("abs").unwrap().as_deref(), Some("b"));
        assert_eq!(fs_.link_name("missing").unwrap(), None);
    }

    #[test]
    fn open_reports_missing_and_plain_files() {
        let dir = tempfile::tempdir().unwrap();
        let fs_ = Rooted::new(dir.path());
        fs::create_dir_all(dir.path().join("dev/dri")).unwrap();
        fs::write(dir.path().join("dev/dri/renderD128"), "").unwrap();
        let p = Path::new("/dev/dri/renderD128");
        match open_node(&fs_, p, NodeKind::Render) {
            Opened::Failed(why) => assert_eq!(why, "not a character device: /dev/dri/renderD128"),
            Opened::Node(_) => panic!("a plain file opened as a node"),
        }
        match open_node(&fs_, Path::new("/dev/dri/renderD129"), NodeKind::Render) {
            Opened::Failed(why) => assert_eq!(why, "missing: /dev/dri/renderD129"),
            Opened::Node(_) => panic!("a missing file opened"),
        }
        // /dev/null is a character device of the wrong major.
        let live = Rooted::new("/");
        match open_node(&live, Path::new("/dev/null"), NodeKind::Accel) {
            Opened::Failed(why) => assert!(why.starts_with("not an accel node"), "{why}"),
            Opened::Node(_) => panic!("/dev/null accepted as an accel node"),
        }
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(describe_open_error("/x", &denied), "permission denied: /x");
    }
}
