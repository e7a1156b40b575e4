#!/usr/bin/env python3
"""Writes the sysfs/dev fixture trees under devices/ (run from the repo root).

Each tree mirrors what a real host shows under /sys and /dev, reduced to the
files accel::probe reads. Symlinks are relative, as in real sysfs. Device
nodes under dev/ are plain files (a fixture cannot hold character devices), so
the probe reports them as "not a character device" and takes the driver from
sysfs. expect.json beside each tree is checked by tests/accel_probe.rs.
"""
import os, shutil, sys

def w(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)

def ln(root, rel, target_rel, raw=None):
    """Symlink root/rel -> target (relative to root), written relative like sysfs."""
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    t = raw if raw is not None else os.path.relpath(os.path.join(root, target_rel), os.path.dirname(p))
    os.symlink(t, p)

def nodes(root, online, cpulists):
    base = "sys/devices/system/node"
    w(root, f"{base}/online", online + "\n")
    w(root, f"{base}/possible", online + "\n")
    for n, cpus in cpulists.items():
        w(root, f"{base}/node{n}/cpulist", cpus + "\n")

def pci_dev(root, path, vendor, device, numa, local, driver, cls="0x030200", slot=None, uevent_driver=True):
    slot = slot or os.path.basename(path)
    w(root, f"{path}/vendor", vendor + "\n")
    w(root, f"{path}/device", device + "\n")
    w(root, f"{path}/class", cls + "\n")
    if numa is not None:
        w(root, f"{path}/numa_node", numa + "\n")
    if local is not None:
        w(root, f"{path}/local_cpulist", local + "\n")
    ue = ""
    if driver and uevent_driver:
        ue += f"DRIVER={driver}\n"
    ue += f"PCI_CLASS={cls[2:].lstrip('0').upper()}\nPCI_ID={vendor[2:].upper()}:{device[2:].upper()}\n"
    ue += f"PCI_SLOT_NAME={slot}\nMODALIAS=pci:v0000{vendor[2:].upper()}d0000{device[2:].upper()}\n"
    w(root, f"{path}/uevent", ue)
    if driver:
        w(root, f"sys/bus/pci/drivers/{driver}/bind", "")
        ln(root, f"{path}/driver", f"sys/bus/pci/drivers/{driver}")
    ln(root, f"{path}/subsystem", "sys/bus/pci")

def drm_minor(root, devpath, name, minor, cls="drm", major=226, dev=True):
    p = f"{devpath}/{cls}/{name}"
    w(root, f"{p}/dev", f"{major}:{minor}\n")
    devname = f"dri/{name}" if cls == "drm" else f"accel/{name}"
    w(root, f"{p}/uevent", f"MAJOR={major}\nMINOR={minor}\nDEVNAME={devname}\n" + ("DEVTYPE=drm_minor\n" if cls == "drm" else ""))
    ln(root, f"{p}/device", None, raw="../../../" + os.path.basename(devpath))
    ln(root, f"{p}/subsystem", f"sys/class/{cls}")
    ln(root, f"sys/class/{cls}/{name}", p)
    if dev:
        w(root, f"dev/{devname}", "")

def nvidia_2node(root):
    nodes(root, "0-1", {0: "0-15,32-47", 1: "16-31,48-63"})
    gpu = "sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0"
    pci_dev(root, gpu, "0x10de", "0x2330", "1", "16-31,48-63", "nvidia")
    drm_minor(root, gpu, "card1", 1)
    drm_minor(root, gpu, "renderD128", 128)

def intel_igpu(root):
    nodes(root, "0", {0: "0-7"})
    gpu = "sys/devices/pci0000:00/0000:00:02.0"
    pci_dev(root, gpu, "0x8086", "0xa7a0", "-1", "0-7", "i915")
    drm_minor(root, gpu, "card0", 0, dev=False)
    drm_minor(root, gpu, "renderD128", 128, dev=False)
    # No dev/dri: a container without the render node passed through.

def amd_two_render(root):
    nodes(root, "0-3", {0: "0-15,64-79", 1: "16-31,80-95", 2: "32-47,96-111", 3: "48-63,112-127"})
    for i, (bridge, addr) in enumerate([("0000:c0:01.1/0000:c1:00.0/0000:c2:00.0", "0000:c3:00.0"),
                                         ("0000:c0:03.1/0000:c6:00.0/0000:c7:00.0", "0000:c8:00.0")]):
        gpu = f"sys/devices/pci0000:c0/{bridge}/{addr}"
        pci_dev(root, gpu, "0x1002", "0x740c", "3", "48-63,112-127", "amdgpu", cls="0x038000")
        drm_minor(root, gpu, f"card{i}", i)
        drm_minor(root, gpu, f"renderD{128 + i}", 128 + i)

def npu_accel(root):
    nodes(root, "0", {0: "0-21"})
    npu = "sys/devices/pci0000:00/0000:00:0b.0"
    pci_dev(root, npu, "0x8086", "0x7d1d", "-1", "0-21", "intel_vpu", cls="0x120000")
    drm_minor(root, npu, "accel0", 0, cls="accel", major=261)
    # The iGPU beside it has no render node exposed here (accel-only fixture).

def platform_gpu(root):
    nodes(root, "0", {0: "0-7"})
    gpu = "sys/devices/platform/fb000000.gpu"
    w(root, f"{gpu}/uevent", "DRIVER=panthor\nOF_NAME=gpu\nOF_FULLNAME=/gpu@fb000000\n"
      "OF_COMPATIBLE_0=rockchip,rk3588-mali\nOF_COMPATIBLE_1=arm,mali-valhall-csf\nOF_COMPATIBLE_N=2\n"
      "MODALIAS=of:NgpuT(null)Crockchip,rk3588-maliCarm,mali-valhall-csf\n")
    w(root, "sys/bus/platform/drivers/panthor/bind", "")
    ln(root, f"{gpu}/driver", "sys/bus/platform/drivers/panthor")
    ln(root, f"{gpu}/subsystem", "sys/bus/platform")
    w(root, f"{gpu}/driver_override", "(null)\n")
    drm_minor(root, gpu, "card0", 0)
    drm_minor(root, gpu, "renderD128", 128)

def vm_nonuma(root):
    # No sys/devices/system/node: the guest kernel shows no NUMA information.
    pcidev = "sys/devices/pci0000:00/0000:00:02.0"
    pci_dev(root, pcidev, "0x1af4", "0x1050", None, None, "virtio-pci")
    vdev = f"{pcidev}/virtio0"
    w(root, f"{vdev}/uevent", "DRIVER=virtio_gpu\nMODALIAS=virtio:d00000010v00001AF4\n")
    w(root, f"{vdev}/device", "0x0010\n")
    w(root, f"{vdev}/vendor", "0x1af4\n")
    w(root, "sys/bus/virtio/drivers/virtio_gpu/bind", "")
    ln(root, f"{vdev}/driver", "sys/bus/virtio/drivers/virtio_gpu")
    drm_minor(root, vdev, "card0", 0)
    drm_minor(root, vdev, "renderD128", 128)

def bad_sysfs(root):
    nodes(root, "0-1", {0: "0-3", 1: "4-7"})
    cases = {128: None, 129: "-1", 130: "", 131: "banana", 132: "7", 133: "LOOP"}
    for minor, numa in cases.items():
        gpu = f"sys/devices/pci0000:00/0000:00:{minor - 120:02x}.0"
        pci_dev(root, gpu, "0x1234", "0x1111", None, None, None)
        w(root, f"{gpu}/uevent", f"DRIVER=fake_drv\nPCI_SLOT_NAME=0000:00:{minor - 120:02x}.0\n")
        if numa == "LOOP":
            ln(root, f"{gpu}/numa_node", None, raw="numa_node")
        elif numa is not None:
            w(root, f"{gpu}/numa_node", numa if numa == "" else numa + "\n")
        drm_minor(root, gpu, f"renderD{minor}", minor)
    w(root, "sys/devices/pci0000:00/0000:00:08.0/vendor", "0xZZZZ\n")  # garbage id on renderD128's device
    # renderD134: the class entry itself is a symlink loop; the node exists under dev/.
    ln(root, "sys/class/drm/renderD134", None, raw="renderD134")
    w(root, "dev/dri/renderD134", "")
    # Names the probe must ignore.
    for junk in ["card0", "controlD64", "renderD5", "renderDx", "by-path"]:
        w(root, f"dev/dri/{junk}", "")

FIXTURES = {
    "nvidia-2node": nvidia_2node,
    "intel-igpu": intel_igpu,
    "amd-two-render": amd_two_render,
    "npu-accel": npu_accel,
    "platform-gpu": platform_gpu,
    "vm-nonuma": vm_nonuma,
    "bad-sysfs": bad_sysfs,
}

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "devices"
    for name, make in FIXTURES.items():
        root = os.path.join(out, name)
        for sub in ("sys", "dev"):
            shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        make(root)
        print("wrote", root)
