//! Pure parsers for the sysfs attributes that `accel::probe` reads.
//!
//! Every function here takes the text of one attribute (or one path) and
//! returns a `Result`; none touches the filesystem and none panics, whatever
//! the bytes. The probe turns each error into a `None` field plus a note on
//! the device, so bad sysfs content gives a defined answer (issue 7):
//!
//! | attribute            | example           | parser              |
//! |----------------------|-------------------|---------------------|
//! | `device/numa_node`   | `1`, `-1`         | [`parse_numa_node`] |
//! | `node/online`, `nodeN/cpulist`, `device/local_cpulist` | `0-3,8-11` | [`parse_cpulist`] (from `rt::sysfs`) |
//! | `device/vendor`, `device/device` | `0x10de` | [`parse_hex_id`] |
//! | `device/uevent`      | `DRIVER=nvidia`   | [`parse_uevent`]    |
//! | PCI path component   | `0000:65:00.0`    | [`parse_pci_address`] |
//!
//! Kernel references: `Documentation/ABI/testing/sysfs-bus-pci` (numa_node,
//! vendor, device, local_cpulist) and `Documentation/ABI/stable/sysfs-devices-node`
//! (online, cpulist).

use std::fmt;

// The bounded list parser and its error live in the runtime (the executor
// reads NUMA cpulists with it and must know no devices); re-exported here.
use crate::rt::sysfs::garbage;
pub use crate::rt::sysfs::{MAX_LIST_ID, ParseError, parse_cpulist};

/// NUMA affinity of a device as written in `device/numa_node`.
///
/// `-1` is the kernel's "no affinity" (`NUMA_NO_NODE`): the device is not
/// attached to any node, or the platform does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumaNode {
    /// `-1`: no node (the loop-0 fallback of B-163 applies).
    NoNode,
    /// A node number (still to be checked against the online nodes).
    Node(u32),
}

/// Parses `device/numa_node`: a decimal node number or `-1`.
///
/// # Errors
/// [`ParseError::Empty`] for an empty file, [`ParseError::Garbage`] for
/// anything not an integer, [`ParseError::OutOfRange`] for a negative value
/// other than -1 or a node at or beyond [`MAX_LIST_ID`].
pub fn parse_numa_node(text: &str) -> Result<NumaNode, ParseError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ParseError::Empty);
    }
    let v: i64 = t.parse().map_err(|_| garbage(t))?;
    match v {
        -1 => Ok(NumaNode::NoNode),
        0.. if v < i64::from(MAX_LIST_ID) => Ok(NumaNode::Node(v as u32)),
        _ => Err(ParseError::OutOfRange(t.to_string())),
    }
}

/// Formats ids back into the kernel's list form (`0-3,8`), for reports.
pub fn format_cpulist(ids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// Parses a PCI id attribute (`device/vendor`, `device/device`): `0x` and four
/// hex digits, e.g. `0x10de`.
///
/// # Errors
/// [`ParseError::Empty`] or [`ParseError::Garbage`].
pub fn parse_hex_id(text: &str) -> Result<u16, ParseError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ParseError::Empty);
    }
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| garbage(t))?;
    u16::from_str_radix(digits, 16).map_err(|_| garbage(t))
}

/// A PCI bus address `domain:bus:device.function`, e.g. `0000:65:00.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI segment (domain), 16 bits in sysfs names (4 hex digits; some hosts use more).
    pub domain: u32,
    /// Bus number (0..=255).
    pub bus: u8,
    /// Device (slot) number (0..=31).
    pub device: u8,
    /// Function number (0..=7).
    pub function: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Parses a PCI address as sysfs names a PCI device directory or
/// `PCI_SLOT_NAME=` gives it: `DDDD:BB:SS.F` in hex.
///
/// # Errors
/// [`ParseError::Garbage`] when `text` is not of that form (e.g. a
/// platform-bus name such as `fd4a0000.gpu`, or `pci0000:00`).
pub fn parse_pci_address(text: &str) -> Result<PciAddress, ParseError> {
    let t = text.trim();
    let parse = || -> Option<PciAddress> {
        let (domain, rest) = t.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |s: &str, len: usize| -> Option<()> {
            (s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())
        };
        hex(bus, 2)?;
        hex(device, 2)?;
        hex(function, 1)?;
        if domain.len() < 4 || domain.len() > 8 || !domain.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let addr = PciAddress {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u8::from_str_radix(bus, 16).ok()?,
            device: u8::from_str_radix(device, 16).ok()?,
            function: u8::from_str_radix(function, 16).ok()?,
        };
        (addr.device < 32 && addr.function < 8).then_some(addr)
    };
    parse().ok_or_else(|| garbage(t))
}

/// The fields of a device's `uevent` file that the probe uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uevent {
    /// `DRIVER=`: the bound kernel driver.
    pub driver: Option<String>,
    /// `PCI_SLOT_NAME=`: the PCI address of a PCI device.
    pub pci_slot: Option<String>,
    /// `PCI_ID=`: `VVVV:DDDD` vendor and device ids.
    pub pci_id: Option<(u16, u16)>,
}

/// Parses `KEY=value` lines of a `uevent` file. Lines without `=`, unknown
/// keys and empty values are ignored; a malformed `PCI_ID` is ignored.
pub fn parse_uevent(text: &str) -> Uevent {
    let mut ev = Uevent::default();
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once('=') else {
            continue;
        };
        if value.is_empty() {
            continue;
        }
        match key {
            "DRIVER" => ev.driver = Some(value.to_string()),
            "PCI_SLOT_NAME" => ev.pci_slot = Some(value.to_string()),
            "PCI_ID" => ev.pci_id = parse_pci_id(value),
            _ => {}
        }
    }
    ev
}

fn parse_pci_id(value: &str) -> Option<(u16, u16)> {
    let (v, d) = value.split_once(':')?;
    Some((
        u16::from_str_radix(v, 16).ok()?,
        u16::from_str_radix(d, 16).ok()?,
    ))
}

/// Parses a node directory name under `devices/system/node` (`node1` -> 1).
///
/// # Errors
/// [`ParseError::Garbage`] for any other name (`online`, `power`, `nodeX`).
pub fn parse_node_dir(name: &str) -> Result<u32, ParseError> {
    name.strip_prefix("node")
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<u32>().ok())
        .filter(|&n| n < MAX_LIST_ID)
        .ok_or_else(|| garbage(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_node_forms() {
        assert_eq!(parse_numa_node("1\n"), Ok(NumaNode::Node(1)));
        assert_eq!(parse_numa_node("0"), Ok(NumaNode::Node(0)));
        assert_eq!(parse_numa_node("-1\n"), Ok(NumaNode::NoNode));
        assert_eq!(parse_numa_node(""), Err(ParseError::Empty));
        assert_eq!(parse_numa_node(" \n"), Err(ParseError::Empty));
        assert!(matches!(
            parse_numa_node("abc"),
            Err(ParseError::Garbage(_))
        ));
        assert!(matches!(parse_numa_node("1x"), Err(ParseError::Garbage(_))));
        assert!(matches!(
            parse_numa_node("-2"),
            Err(ParseError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_numa_node("99999999999999999999"),
            Err(ParseError::Garbage(_))
        ));
        assert!(matches!(
            parse_numa_node("70000"),
            Err(ParseError::OutOfRange(_))
        ));
    }

    #[test]
    fn cpulists_format_back() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n").unwrap().len(), 7);
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[]), "");
    }

    #[test]
    fn hex_ids_and_pci_addresses() {
        assert_eq!(parse_hex_id("0x10de\n"), Ok(0x10de));
        assert_eq!(parse_hex_id(""), Err(ParseError::Empty));
        assert!(parse_hex_id("10de").is_err());
        assert!(parse_hex_id("0x1ffff").is_err());
        let a = parse_pci_address("0000:65:00.0").unwrap();
        assert_eq!((a.domain, a.bus, a.device, a.function), (0, 0x65, 0, 0));
        assert_eq!(a.to_string(), "0000:65:00.0");
        for bad in [
            "pci0000:00",
            "fd4a0000.gpu",
            "0000:65:00",
            "0000:65:20.0",
            "0000:6:00.0",
            "",
        ] {
            assert!(parse_pci_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uevent_and_node_dirs() {
        let ev = parse_uevent(
            "DRIVER=amdgpu\nPCI_ID=1002:744C\nPCI_SLOT_NAME=0000:03:00.0\nnoise\nX=\n",
        );
        assert_eq!(ev.driver.as_deref(), Some("amdgpu"));
        assert_eq!(ev.pci_id, Some((0x1002, 0x744c)));
        assert_eq!(ev.pci_slot.as_deref(), Some("0000:03:00.0"));
        assert_eq!(parse_uevent("DRIVER=\n"), Uevent::default());
        assert_eq!(parse_node_dir("node12"), Ok(12));
        assert!(parse_node_dir("node").is_err());
        assert!(parse_node_dir("online").is_err());
        assert!(parse_node_dir("node-1").is_err());
    }
}
