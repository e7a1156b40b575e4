//! The case registry: every suite's cases in one list, and the selection of
//! a run (`--suite`, `--include`, `--skips`, `--fraction`).

use regex::{Regex, RegexSet};

use super::case::{Case, Suite};
use super::file_error::FileError;
use super::suites;
use xtc_model::vulkan::ops::Variant;

/// Every registered case, suites in [`Suite::ALL`] order then the hidden
/// [`Suite::Selftest`]; within a suite, in the order its module lists them.
///
/// # Panics
/// If two cases share a name (a registry bug, caught by the unit tests).
pub fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    suites::kernels::cases(&mut v);
    suites::fence::cases(&mut v);
    suites::batch::cases(&mut v);
    suites::dispatch::cases(&mut v);
    suites::decode::cases(&mut v);
    suites::perf::cases(&mut v);
    suites::selftest::cases(&mut v);
    v
}

/// Which cases a run takes.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Suites (empty: every suite of [`Suite::ALL`]).
    pub suites: Vec<Suite>,
    /// Only names matching this (searched anywhere in the name).
    pub include: Option<Regex>,
    /// Names matching any of these are reported `Skip` without running.
    pub skips: Option<RegexSet>,
    /// Run 1 case in `fraction` (deqp-runner's `--fraction`), 1 = all.
    pub fraction: usize,
    /// Starting with the `fraction_start`-th selected case (1-based).
    pub fraction_start: usize,
    /// `--kernels`: only the cases that pin this kernel form or none
    /// ([`Case::form`]); `None` (`auto`): every case.
    pub kernels: Option<Variant>,
}

/// The cases of a run: `(to run, skipped by --skips)`, each in registry
/// order.
pub fn select(all: &[Case], sel: &Selection) -> (Vec<Case>, Vec<Case>) {
    let suites: &[Suite] = if sel.suites.is_empty() {
        &Suite::ALL
    } else {
        &sel.suites
    };
    let fraction = sel.fraction.max(1);
    let start = sel.fraction_start.max(1) - 1;
    let chosen = all
        .iter()
        .filter(|c| suites.contains(&c.suite))
        .filter(|c| sel.kernels.is_none() || c.form.is_none() || c.form == sel.kernels)
        .filter(|c| sel.include.as_ref().is_none_or(|r| r.is_match(&c.name)))
        .enumerate()
        .filter(|(i, _)| *i >= start && (i - start).is_multiple_of(fraction))
        .map(|(_, c)| c.clone());
    chosen.partition(|c| !sel.skips.as_ref().is_some_and(|s| s.is_match(&c.name)))
}

/// Reads a regex list (`--skips`, `--flakes`): one regex a line, `#`
/// comments and blank lines ignored (the format of deqp-runner's lists).
///
/// # Errors
/// [`FileError::Read`] when the file cannot be read, [`FileError::Invalid`]
/// when a line is not a regex (naming the line) or the set does not build.
pub fn read_regex_list(path: &std::path::Path) -> Result<RegexSet, FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| FileError::read(path, e))?;
    let mut pats = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        Regex::new(l).map_err(|e| {
            FileError::invalid(path, Some(i as u64 + 1), format!("not a regex: {e}"))
        })?;
        pats.push(l.to_owned());
    }
    RegexSet::new(pats).map_err(|e| FileError::invalid(path, None, e))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_stable_paths() {
        let all = all_cases();
        let mut seen = HashSet::new();
        for c in &all {
            assert!(seen.insert(c.name.clone()), "duplicate case {}", c.name);
            assert!(
                c.name
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._".contains(ch)),
                "name {} has characters outside [a-z0-9._]",
                c.name
            );
            assert!(c.group.starts_with(&format!("xtc.{}", c.suite.name())));
        }
        for s in Suite::ALL {
            assert!(all.iter().any(|c| c.suite == s), "suite {s:?} has no case");
        }
    }

    #[test]
    fn selection_filters_skips_and_fractions() {
        let all = all_cases();
        let sel = Selection {
            suites: vec![Suite::Selftest],
            include: Some(Regex::new("pass").unwrap()),
            ..Selection::default()
        };
        let (run, skipped) = select(&all, &sel);
        assert!(!run.is_empty() && skipped.is_empty());
        assert!(run.iter().all(|c| c.name.contains("pass")));
        let sel = Selection {
            suites: vec![Suite::Selftest],
            skips: Some(RegexSet::new(["hang"]).unwrap()),
            ..Selection::default()
        };
        let (run, skipped) = select(&all, &sel);
        assert!(skipped.iter().all(|c| c.name.contains("hang")) && !skipped.is_empty());
        assert!(run.iter().all(|c| !c.name.contains("hang")));
        let whole = select(&all, &Selection::default()).0;
        let halves: Vec<Vec<Case>> = (1..=2)
            .map(|k| {
                let sel = Selection {
                    fraction: 2,
                    fraction_start: k,
                    ..Selection::default()
                };
                select(&all, &sel).0
            })
            .collect();
        assert_eq!(halves[0].len() + halves[1].len(), whole.len());
        assert_eq!(halves[0][0].name, whole[0].name);
        assert_eq!(halves[1][0].name, whole[1].name);
        assert!(whole.iter().all(|c| c.suite != Suite::Selftest));
    }
}
