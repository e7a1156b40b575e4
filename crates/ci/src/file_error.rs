//! [`FileError`]: why a file of a run (a baseline, a regex list, an output
//! file) could not be read or written. One type for every file the runner
//! touches, by what the caller does about it: a path to fix, a line to fix,
//! a folder to make writable.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a run's file could not be read, understood or written. Each variant
/// names the file; its `Display` is the message the command prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The file could not be read (missing, unreadable); carries the OS error.
    #[error("cannot read {}: {msg}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error's text.
        msg: String,
    },
    /// The file was read but is not what it should be (a line without a
    /// status or with an unknown one, a line that is not a regex, a table
    /// that does not parse); `line` is 1-based where one line is at fault.
    #[error("{}: {msg}", Located(path, *line))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line at fault, if one is.
        line: Option<u64>,
        /// What is wrong.
        msg: String,
    },
    /// The file or its folder could not be written; carries the OS error.
    #[error("cannot write {}: {msg}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The OS error's text.
        msg: String,
    },
    /// A report could not be serialized (JSON, JUnit XML).
    #[error("{0}")]
    Serialize(String),
}

impl FileError {
    /// [`FileError::Read`] of `path` with `e`'s text.
    pub fn read(path: &Path, e: impl fmt::Display) -> FileError {
        FileError::Read {
            path: path.to_owned(),
            msg: e.to_string(),
        }
    }

    /// [`FileError::Write`] of `path` with `e`'s text.
    pub fn write(path: &Path, e: impl fmt::Display) -> FileError {
        FileError::Write {
            path: path.to_owned(),
            msg: e.to_string(),
        }
    }

    /// [`FileError::Invalid`] of `path` (at `line`, if one) with `e`'s text.
    pub fn invalid(path: &Path, line: Option<u64>, e: impl fmt::Display) -> FileError {
        FileError::Invalid {
            path: path.to_owned(),
            line,
            msg: e.to_string(),
        }
    }
}

/// The text of a [`FileError`], for callers whose own errors are still
/// strings (the `xtc ci` command).
impl From<FileError> for String {
    fn from(e: FileError) -> String {
        e.to_string()
    }
}

/// `path` or `path:line`.
struct Located<'a>(&'a Path, Option<u64>);

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(line) => write!(f, "{}:{line}", self.0.display()),
            None => write!(f, "{}", self.0.display()),
        }
    }
}
