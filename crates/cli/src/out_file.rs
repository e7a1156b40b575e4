//! Output files of a command (`--trace-out`, `--requests-out`,
//! `--metrics-out`, `--csv-out`, `--plot-out`), checked before the work and
//! written atomically after it.
//!
//! A regular file (or a path that does not exist yet) is written atomically:
//! the content goes to a temporary file in the same directory, which is
//! renamed over the target only after the run succeeded, so a failed or
//! interrupted run leaves no file, or the previous one as it was. The
//! directory is probed up front (a temporary file created and removed at
//! once), so a bad path fails before minutes of work and an interrupted run
//! leaves nothing behind. Anything else that exists (`/dev/stdout`, a FIFO)
//! is opened up front and written in place after the run.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where one output option is written (see the module doc).
#[derive(Debug)]
pub struct OutFile {
    /// The option, for messages (`--trace-out`).
    option: &'static str,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// Temporary file in `dir`, renamed to `target` (symlinks resolved),
    /// with permission bits `mode` (the old file's, else `0o666` less umask).
    Atomic {
        path: PathBuf,
        target: PathBuf,
        dir: PathBuf,
        mode: Option<u32>,
    },
    /// Written in place: not a regular file.
    InPlace { path: PathBuf, file: std::fs::File },
}

impl OutFile {
    /// Checks `option`'s `path` before the run: refuses a directory, one of
    /// the `inputs` (`(option, path)` of the files the run reads), a file it
    /// may not write, or a place no file can be created.
    ///
    /// # Errors
    /// A message naming `option`, the path and what is wrong.
    pub fn prepare(
        option: &'static str,
        path: &Path,
        inputs: &[(&str, Option<&Path>)],
    ) -> Result<OutFile, String> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!("{option} {}: {what}: {e}", path.display())
        };
        let existing = match std::fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail("cannot use the path", &e)),
        };
        if let Some(m) = &existing {
            if m.is_dir() {
                return Err(format!(
                    "{option} {} is a directory: name a file",
                    path.display()
                ));
            }
            for (opt, input) in inputs {
                let Some(input) = input else { continue };
                let same = std::fs::metadata(input)
                    .is_ok_and(|i| (i.dev(), i.ino()) == (m.dev(), m.ino()));
                if same {
                    return Err(format!(
                        "{option} {} is the {opt} file: it would be overwritten; \
                         write the output elsewhere",
                        path.display()
                    ));
                }
            }
            if !m.is_file() {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| fail("cannot open it for writing", &e))?;
                return Ok(OutFile {
                    option,
                    kind: Kind::InPlace {
                        path: path.to_path_buf(),
                        file,
                    },
                });
            }
            // A rename would replace a read-only file: refuse it, as writing would.
            rustix::fs::access(path, rustix::fs::Access::WRITE_OK)
                .map_err(|e| fail("cannot write it", &std::io::Error::from(e)))?;
        }
        // Rename over the file a symlink points to, not over the link.
        let target = match &existing {
            Some(_) => std::fs::canonicalize(path).map_err(|e| fail("cannot resolve it", &e))?,
            None => path.to_path_buf(),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let t = OutFile {
            option,
            kind: Kind::Atomic {
                path: path.to_path_buf(),
                target,
                dir,
                mode: existing.map(|m| m.permissions().mode() & 0o7777),
            },
        };
        // The probe: removed again when it drops, here.
        t.temp_file()?;
        Ok(t)
    }

    /// [`OutFile::prepare`] of an optional path.
    ///
    /// # Errors
    /// As [`OutFile::prepare`].
    pub fn prepare_opt(
        option: &'static str,
        path: Option<&Path>,
        inputs: &[(&str, Option<&Path>)],
    ) -> Result<Option<OutFile>, String> {
        path.map(|p| OutFile::prepare(option, p, inputs))
            .transpose()
    }

    /// The path as the user gave it.
    pub fn path(&self) -> &Path {
        match &self.kind {
            Kind::Atomic { path, .. } | Kind::InPlace { path, .. } => path,
        }
    }

    /// A new temporary file beside the target.
    fn temp_file(&self) -> Result<tempfile::NamedTempFile, String> {
        use std::os::unix::fs::PermissionsExt;
        let Kind::Atomic {
            path, dir, mode, ..
        } = &self.kind
        else {
            unreachable!("only atomic output files use a temporary file");
        };
        let mut b = tempfile::Builder::new();
        b.prefix(".xtc-out-").suffix(".tmp");
        // The file's permissions: as the file it replaces, else as a file
        // created by open(2) (0o666 less the umask).
        b.permissions(std::fs::Permissions::from_mode(mode.unwrap_or(0o666)));
        let f = b.tempfile_in(dir).map_err(|e| {
            format!(
                "{} {}: cannot create a file in {}: {e}",
                self.option,
                path.display(),
                dir.display()
            )
        })?;
        if let Some(m) = mode {
            // The umask applied at creation: restore the old file's bits.
            f.as_file()
                .set_permissions(std::fs::Permissions::from_mode(*m))
                .map_err(|e| format!("{} {}: {e}", self.option, path.display()))?;
        }
        Ok(f)
    }

    /// Writes `bytes` (after the report was printed).
    ///
    /// # Errors
    /// A message naming the option and the path; the report printed before
    /// is complete.
    pub fn write(self, bytes: &[u8]) -> Result<(), String> {
        let option = self.option;
        let late = |p: &Path, e: &dyn std::fmt::Display| {
            format!(
                "{option} {}: cannot write it (the report above is complete): {e}",
                p.display()
            )
        };
        match &self.kind {
            Kind::InPlace { path, file } => {
                let mut file = file;
                file.write_all(bytes).map_err(|e| late(path, &e))
            }
            Kind::Atomic { path, target, .. } => {
                let mut f = self.temp_file()?;
                f.write_all(bytes)
                    .and_then(|()| f.as_file().sync_all())
                    .map_err(|e| late(path, &e))?;
                // On failure the temporary file is removed when it drops.
                f.persist(target).map_err(|e| late(path, &e.error))?;
                Ok(())
            }
        }
    }
}
