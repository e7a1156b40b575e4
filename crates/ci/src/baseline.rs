//! Baseline files: the expected failures (`--baseline`, deqp-runner's
//! `name,Status` CSV) and the per-device tables of perf figures
//! (`--perf-baseline`) and golden tokens (`--golden`), JSON keyed by device
//! (`deviceName | driverName driverInfo`) then case name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::file_error::FileError;
use super::status::Status;

/// The expected failures: case name → the status it is expected to fail with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureBaseline(HashMap<String, Status>);

impl FailureBaseline {
    /// Reads `name,Status[,...]` lines (`results.csv`, `failures.csv` and
    /// files written by `--write-baseline` all have this form); `#` comments
    /// and blank lines are ignored; columns after the second too.
    ///
    /// # Errors
    /// [`FileError::Read`] when the file cannot be read,
    /// [`FileError::Invalid`] when a record does not parse or a line has no
    /// status or an unknown one (naming the line).
    pub fn load(path: &Path) -> Result<FailureBaseline, FileError> {
        let mut rd = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .comment(Some(b'#'))
            .from_path(path)
            .map_err(|e| FileError::read(path, e))?;
        let mut map = HashMap::new();
        for rec in rd.records() {
            let rec = rec.map_err(|e| FileError::invalid(path, None, e))?;
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            let name = rec.get(0).unwrap_or("").trim();
            if name.is_empty() {
                continue;
            }
            let status = rec
                .get(1)
                .ok_or_else(|| {
                    FileError::invalid(path, Some(line), format!("{name:?} has no status"))
                })?
                .parse::<Status>()
                .map_err(|e| FileError::invalid(path, Some(line), e))?;
            map.insert(name.to_owned(), status);
        }
        Ok(FailureBaseline(map))
    }

    /// The status the baseline lists for `name`.
    pub fn get(&self, name: &str) -> Option<Status> {
        self.0.get(name).copied()
    }

    /// Listed cases.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A per-device table: device key → case name → value.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize)]
#[serde(bound(deserialize = "T: DeserializeOwned"))]
pub struct DeviceTable<T> {
    /// What the file holds and how to refresh it (kept as written).
    #[serde(default)]
    pub note: String,
    /// Device key → case → value.
    pub devices: BTreeMap<String, BTreeMap<String, T>>,
}

impl<T> Default for DeviceTable<T> {
    fn default() -> Self {
        DeviceTable {
            note: String::new(),
            devices: BTreeMap::new(),
        }
    }
}

impl<T: Serialize + DeserializeOwned> DeviceTable<T> {
    /// Reads a table.
    ///
    /// # Errors
    /// [`FileError::Read`] when the file cannot be read,
    /// [`FileError::Invalid`] when it is not such a table (serde's message).
    pub fn load(path: &Path) -> Result<DeviceTable<T>, FileError> {
        let text = std::fs::read_to_string(path).map_err(|e| FileError::read(path, e))?;
        serde_json::from_str(&text).map_err(|e| FileError::invalid(path, None, e))
    }

    /// Reads a table, or an empty one when `path` does not exist (for
    /// `--write-baseline` into a new file).
    ///
    /// # Errors
    /// As [`DeviceTable::load`] for a file that exists.
    pub fn load_or_default(path: &Path) -> Result<DeviceTable<T>, FileError> {
        if path.exists() {
            DeviceTable::load(path)
        } else {
            Ok(DeviceTable::default())
        }
    }

    /// The value of `case` on device `key`.
    pub fn get(&self, key: &str, case: &str) -> Option<&T> {
        self.devices.get(key)?.get(case)
    }

    /// Replaces device `key`'s entries for the given cases (other devices
    /// and other cases are kept).
    pub fn merge(&mut self, key: &str, entries: impl IntoIterator<Item = (String, T)>) {
        let dev = self.devices.entry(key.to_owned()).or_default();
        dev.extend(entries);
    }

    /// Writes the table (pretty JSON, a newline at the end).
    ///
    /// # Errors
    /// [`FileError::Write`] when the file cannot be written,
    /// [`FileError::Serialize`] when the table cannot be serialized.
    pub fn save(&self, path: &Path) -> Result<(), FileError> {
        let mut text =
            serde_json::to_string_pretty(self).map_err(|e| FileError::Serialize(e.to_string()))?;
        text.push('\n');
        std::fs::write(path, text).map_err(|e| FileError::write(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_baseline_reads_csv_with_comments_and_extra_columns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.csv");
        std::fs::write(
            &p,
            "# lavapipe\nxtc.a.b,Fail,0.5\n\nxtc.a.c,Crash\nxtc.a.d,Pass,1.0\n",
        )
        .unwrap();
        let b = FailureBaseline::load(&p).unwrap();
        assert_eq!(b.get("xtc.a.b"), Some(Status::Fail));
        assert_eq!(b.get("xtc.a.c"), Some(Status::Crash));
        assert_eq!(b.get("xtc.a.d"), Some(Status::Pass));
        assert_eq!(b.get("xtc.a.e"), None);
        std::fs::write(&p, "xtc.a.b,Broken\n").unwrap();
        let e = FailureBaseline::load(&p).unwrap_err();
        assert!(
            matches!(&e, FileError::Invalid { line: Some(1), msg, .. } if msg.contains("Broken")),
            "{e}"
        );
        assert!(e.to_string().contains(":1:"), "{e}");
        std::fs::write(&p, "xtc.a.b\n").unwrap();
        let e = FailureBaseline::load(&p).unwrap_err();
        assert!(e.to_string().contains("no status"), "{e}");
        assert!(
            FailureBaseline::load(&dir.path().join("none.csv"))
                .is_err_and(|e| matches!(e, FileError::Read { .. }))
        );
    }

    #[test]
    fn device_tables_merge_per_device() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.json");
        let mut t: DeviceTable<Vec<u32>> = DeviceTable::load_or_default(&p).unwrap();
        t.merge("gpu | x", [("xtc.d.a".to_owned(), vec![1, 2])]);
        t.merge("cpu | y", [("xtc.d.a".to_owned(), vec![3])]);
        t.save(&p).unwrap();
        let mut back: DeviceTable<Vec<u32>> = DeviceTable::load(&p).unwrap();
        assert_eq!(back, t);
        back.merge("gpu | x", [("xtc.d.a".to_owned(), vec![9])]);
        assert_eq!(back.get("gpu | x", "xtc.d.a"), Some(&vec![9]));
        assert_eq!(back.get("cpu | y", "xtc.d.a"), Some(&vec![3]));
        std::fs::write(&p, "{").unwrap();
        assert!(DeviceTable::<Vec<u32>>::load(&p).is_err());
    }
}
