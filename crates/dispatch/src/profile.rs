//! Device profiles of the emulated NPU (`devices/npu-*.json`).
//!
//! A profile names the geometry of the device (clusters; every cluster is one
//! AIC core and two AIV cores, so a profile with `clusters` clusters has
//! `3 * clusters` cores), how many scheduler threads split the clusters
//! between them (cluster `ci` belongs to thread `ci % sched_threads`), and the
//! optional cost knobs the real-thread emulation busy-waits for (a payload
//! build per prepared core, one store fence, one doorbell store; reference §7.3).

use std::path::Path;

use serde::Deserialize;

use xtc::{Error, Result};

/// Most clusters a profile may declare (the handle array bound of D-03 is
/// `MAX_CLUSTERS * 3`).
pub const MAX_CLUSTERS: usize = 64;

/// Cores per cluster: one AIC (sub-core 0) and two AIV (sub-cores 1, 2).
pub const CORES_PER_CLUSTER: usize = 3;

/// One emulated NPU: geometry, scheduler split and cost knobs.
///
/// Loaded from a JSON file with [`DeviceProfile::load`]; every field is
/// checked by [`DeviceProfile::validate`] (errors are [`Error::Inval`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Profile name (the file stem by convention, e.g. `npu-a2a3`).
    pub name: String,
    /// Clusters (block dims): `1..=MAX_CLUSTERS`.
    pub clusters: usize,
    /// Scheduler threads: `1..=clusters`; each owns the clusters `ci` with
    /// `ci % sched_threads == t`.
    pub sched_threads: usize,
    /// Busy-wait per prepared core in real-thread runs (payload build), ns.
    #[serde(default)]
    pub prepare_ns: u64,
    /// Busy-wait per store fence in real-thread runs (x86 release fences are
    /// free; `dsb st` is not), ns.
    #[serde(default)]
    pub fence_ns: u64,
    /// Busy-wait per doorbell store in real-thread runs, ns.
    #[serde(default)]
    pub store_ns: u64,
}

impl DeviceProfile {
    /// Parses and validates a profile from JSON text.
    ///
    /// Errors: [`Error::Inval`] for malformed JSON, unknown fields, or values
    /// out of range (see [`validate`](Self::validate)).
    pub fn from_json(text: &str) -> Result<DeviceProfile> {
        let p: DeviceProfile = serde_json::from_str(text).map_err(|_| Error::Inval)?;
        p.validate()?;
        Ok(p)
    }

    /// Loads a profile file (`.json`).
    ///
    /// Errors: [`Error::Inval`] when the file cannot be read, is not `.json`,
    /// or does not parse/validate.
    pub fn load(path: &Path) -> Result<DeviceProfile> {
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            return Err(Error::Inval);
        }
        let text = std::fs::read_to_string(path).map_err(|_| Error::Inval)?;
        DeviceProfile::from_json(&text)
    }

    /// The a2a3-like profile shipped in `devices/npu-a2a3.json` (24 clusters,
    /// 72 cores, 3 scheduler threads).
    pub fn a2a3() -> DeviceProfile {
        DeviceProfile::from_json(include_str!("../../../devices/npu-a2a3.json"))
            .expect("shipped profile npu-a2a3.json is valid")
    }

    /// The small test profile shipped in `devices/npu-small.json` (6 clusters,
    /// 18 cores, 3 scheduler threads, no cost knobs).
    pub fn small() -> DeviceProfile {
        DeviceProfile::from_json(include_str!("../../../devices/npu-small.json"))
            .expect("shipped profile npu-small.json is valid")
    }

    /// Checks ranges: `1 <= clusters <= MAX_CLUSTERS`,
    /// `1 <= sched_threads <= clusters`, a non-empty name, and cost knobs
    /// under one millisecond each. Errors: [`Error::Inval`].
    pub fn validate(&self) -> Result<()> {
        let ok = !self.name.is_empty()
            && (1..=MAX_CLUSTERS).contains(&self.clusters)
            && (1..=self.clusters).contains(&self.sched_threads)
            && [self.prepare_ns, self.fence_ns, self.store_ns]
                .iter()
                .all(|&c| c < 1_000_000);
        if ok { Ok(()) } else { Err(Error::Inval) }
    }

    /// Total cores (`3 * clusters`).
    pub fn cores(&self) -> usize {
        self.clusters * CORES_PER_CLUSTER
    }

    /// Scheduler thread that owns cluster `ci`.
    pub fn owner_of_cluster(&self, ci: usize) -> usize {
        ci % self.sched_threads
    }

    /// Clusters owned by scheduler thread `t`, ascending.
    pub fn clusters_of(&self, t: usize) -> Vec<usize> {
        (0..self.clusters)
            .filter(|&ci| self.owner_of_cluster(ci) == t)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_profiles_load() {
        let a = DeviceProfile::a2a3();
        assert_eq!((a.clusters, a.cores()), (24, 72));
        let s = DeviceProfile::small();
        assert_eq!(s.clusters_of(1), vec![1, 4]);
    }

    #[test]
    fn bad_profiles_are_rejected() {
        for bad in [
            "{",
            r#"{"name":"x","clusters":0,"sched_threads":1}"#,
            r#"{"name":"x","clusters":4,"sched_threads":5}"#,
            r#"{"name":"x","clusters":65,"sched_threads":1}"#,
            r#"{"name":"","clusters":4,"sched_threads":1}"#,
            r#"{"name":"x","clusters":4,"sched_threads":1,"bogus":1}"#,
        ] {
            assert_eq!(DeviceProfile::from_json(bad), Err(Error::Inval), "{bad}");
        }
        assert_eq!(
            DeviceProfile::load(Path::new("devices/none.toml")),
            Err(Error::Inval)
        );
        assert_eq!(
            DeviceProfile::load(Path::new("devices/missing.json")),
            Err(Error::Inval)
        );
    }
}
