//! The profile's CPUs as Linux's sysfs shows them: `sys/devices/system/cpu` and
//! `sys/devices/system/node` under a host root, for CPU topology readers that take
//! a root prefix (the CPU DRA driver of kubernetes-sigs reads
//! `$HOST_ROOT/sys/devices/system/...`).
//!
//! What is written, and where each file's format comes from (the kernel's ABI
//! documents, `Documentation/ABI/` in the Linux tree):
//!
//! - `cpu/online`, `cpu/possible`, `cpu/present`: cpulists of every CPU of the
//!   profile (`testing/sysfs-devices-system-cpu`: "cpu/{kernel_max,offline,online,
//!   possible,present}"; the list format is `Documentation/admin-guide/cputopology.rst`'s
//!   "0-3,8" form). All CPUs are online.
//! - `cpu/cpuN/topology/{physical_package_id,core_id,thread_siblings_list,
//!   core_cpus_list,core_siblings_list,package_cpus_list}`
//!   (`stable/sysfs-devices-system-cpu`, "cpuX/topology/..."). `core_id` is the
//!   core's number within its package (the ABI says it is platform dependent and
//!   unique only within the package; on x86 it comes from the APIC id per
//!   package). Threads of one core follow the profile's numbering rule, the same
//!   as [`crate::hwloc_xml`]: a NUMA node's sorted CPU list split into
//!   `threads_per_core` equal parts, core k owning the k-th CPU of each part
//!   (Linux on x86: all first threads, then all second threads).
//! - `cpu/cpuN/nodeM`: a symlink to `../../node/nodeM` (`testing/sysfs-devices-system-cpu`,
//!   "cpu#/node": "a symbolic link that points to the corresponding NUMA node
//!   directory").
//! - `cpu/cpuN/cache/index3/{level,type,id,shared_cpu_list}` (`testing/sysfs-devices-system-cpu`,
//!   "cpu*/cache/index*/<attributes>": level, type, id, shared_cpu_list). Only the
//!   last-level cache, L3, the one cache a CPU topology reader groups CPUs by; the
//!   kernel numbers the index directories from L1 up, and on these x86 and Arm
//!   server parts L1d, L1i and L2 come first, so L3 is `index3`. The lower levels
//!   are left out: nothing here reads them. Which CPUs share an L3: those of
//!   [`Package::l3_cores`] consecutive cores of the package, or the whole package
//!   when the profile does not say (Intel Xeon Scalable: one LLC per socket, also
//!   under SNC, where the kernel's L3 cache id stays per socket). `id` numbers the
//!   L3 instances across the machine in package order.
//! - `cpu/smt/control` and `cpu/smt/active` (`testing/sysfs-devices-system-cpu`,
//!   "cpu/smt/{active,control}"): `on`/`1` when the profile has more than one
//!   thread per core, else `notsupported`/`0`.
//! - `node/online`, `node/possible`, `node/has_cpu`: nodelists
//!   (`stable/sysfs-devices-node`), `has_cpu` without the CPU-less gpu-memory nodes;
//!   `node/nodeM/cpulist` (empty line for a CPU-less node), `node/nodeM/distance`
//!   (the profile's SLIT row) and `node/nodeM/cpuN` symlinks to `../../cpu/cpuN`
//!   (`stable/sysfs-devices-node`: "nodeX/cpulist", "nodeX/distance", "nodeX/cpuX").
//!
//! Real sysfs attributes end with a newline; so do these.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::profile::{NumaKind, Package, Profile, parse_cpu_list};

/// Where the tree goes under the host root.
pub const SYSTEM_DIR: &str = "sys/devices/system";

/// One CPU's place in the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPlace {
    pub cpu: u32,
    pub package: u32,
    /// Core number within the package.
    pub core_id: u32,
    pub numa_node: u32,
    /// The CPUs of its core (itself included), sorted.
    pub siblings: Vec<u32>,
    /// Machine-wide index of the L3 it shares.
    pub l3_id: u32,
}

/// Every CPU of the profile, sorted by CPU number. Expects a validated profile.
pub fn places(profile: &Profile) -> Vec<CpuPlace> {
    let tpc = profile.threads_per_core.max(1) as usize;
    let mut packages: Vec<&Package> = profile.packages.iter().collect();
    packages.sort_by_key(|p| p.os_index);
    let mut out = Vec::new();
    let mut l3_base = 0u32;
    for pkg in packages {
        let mut core_id = 0u32;
        for node in profile.cpu_nodes_of_package(pkg.os_index) {
            let list = parse_cpu_list(&node.cpus).unwrap_or_default();
            let ncores = list.len() / tpc;
            for k in 0..ncores {
                let siblings: Vec<u32> = (0..tpc).map(|t| list[k + t * ncores]).collect();
                let l3 = match pkg.l3_cores {
                    Some(n) if n > 0 => l3_base + core_id / n,
                    _ => l3_base,
                };
                for &cpu in &siblings {
                    out.push(CpuPlace {
                        cpu,
                        package: pkg.os_index,
                        core_id,
                        numa_node: node.os_index,
                        siblings: siblings.clone(),
                        l3_id: l3,
                    });
                }
                core_id += 1;
            }
        }
        let caches = match pkg.l3_cores {
            Some(n) if n > 0 => core_id.div_ceil(n),
            _ => 1,
        };
        l3_base += caches;
    }
    out.sort_by_key(|p| p.cpu);
    out
}

/// Linux cpulist form of a set: "0-3,8".
pub fn cpu_list<'a>(cpus: impl IntoIterator<Item = &'a u32>) -> String {
    let set: BTreeSet<u32> = cpus.into_iter().copied().collect();
    let mut parts = Vec::new();
    let mut it = set.into_iter().peekable();
    while let Some(lo) = it.next() {
        let mut hi = lo;
        while it.peek() == Some(&(hi + 1)) {
            hi = it.next().unwrap_or(hi);
        }
        parts.push(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        });
    }
    parts.join(",")
}

fn put(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

fn link(target: &str, at: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(at) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(target, at)
}

/// Writes the tree under `host_root` (`<host_root>/sys/devices/system/{cpu,node}`)
/// and returns the `system` directory.
pub fn write(host_root: &Path, profile: &Profile) -> std::io::Result<PathBuf> {
    let system = host_root.join(SYSTEM_DIR);
    let cpu_dir = system.join("cpu");
    let node_dir = system.join("node");
    let places = places(profile);
    let all = cpu_list(places.iter().map(|p| &p.cpu));
    for f in ["online", "possible", "present"] {
        put(&cpu_dir.join(f), &all)?;
    }
    let smt = profile.threads_per_core > 1;
    put(
        &cpu_dir.join("smt/control"),
        if smt { "on" } else { "notsupported" },
    )?;
    put(&cpu_dir.join("smt/active"), if smt { "1" } else { "0" })?;

    for p in &places {
        let dir = cpu_dir.join(format!("cpu{}", p.cpu));
        let same = |f: &dyn Fn(&CpuPlace) -> bool| {
            cpu_list(places.iter().filter(|q| f(q)).map(|q| &q.cpu))
        };
        let topo = dir.join("topology");
        put(&topo.join("physical_package_id"), &p.package.to_string())?;
        put(&topo.join("core_id"), &p.core_id.to_string())?;
        let siblings = cpu_list(&p.siblings);
        put(&topo.join("thread_siblings_list"), &siblings)?;
        put(&topo.join("core_cpus_list"), &siblings)?;
        let package = same(&|q| q.package == p.package);
        put(&topo.join("core_siblings_list"), &package)?;
        put(&topo.join("package_cpus_list"), &package)?;
        let l3 = dir.join("cache/index3");
        put(&l3.join("level"), "3")?;
        put(&l3.join("type"), "Unified")?;
        put(&l3.join("id"), &p.l3_id.to_string())?;
        put(&l3.join("shared_cpu_list"), &same(&|q| q.l3_id == p.l3_id))?;
        link(
            &format!("../../node/node{}", p.numa_node),
            &dir.join(format!("node{}", p.numa_node)),
        )?;
    }

    let nodes: Vec<u32> = profile.numa_nodes.iter().map(|n| n.os_index).collect();
    put(&node_dir.join("online"), &cpu_list(&nodes))?;
    put(&node_dir.join("possible"), &cpu_list(&nodes))?;
    let with_cpus: Vec<u32> = profile
        .numa_nodes
        .iter()
        .filter(|n| n.kind == NumaKind::Cpu)
        .map(|n| n.os_index)
        .collect();
    put(&node_dir.join("has_cpu"), &cpu_list(&with_cpus))?;
    for (i, n) in profile.numa_nodes.iter().enumerate() {
        let dir = node_dir.join(format!("node{}", n.os_index));
        let cpus: Vec<u32> = places
            .iter()
            .filter(|p| p.numa_node == n.os_index)
            .map(|p| p.cpu)
            .collect();
        put(&dir.join("cpulist"), &cpu_list(&cpus))?;
        let row = profile.distances.get(i).cloned().unwrap_or_default();
        let row: Vec<String> = row.iter().map(u64::to_string).collect();
        put(&dir.join("distance"), &row.join(" "))?;
        for c in cpus {
            link(&format!("../../cpu/cpu{c}"), &dir.join(format!("cpu{c}")))?;
        }
    }
    Ok(system)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles_dir;

    fn profile(name: &str) -> Profile {
        let yaml =
            std::fs::read_to_string(profiles_dir().join(format!("{name}.yaml"))).expect("profile");
        Profile::from_yaml_str(&yaml).expect("valid")
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn cpu_list_compresses_ranges() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "");
    }

    #[test]
    fn dgx_h100_two_nodes_with_smt_siblings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = write(dir.path(), &profile("dgx-h100")).expect("write");
        let cpu = sys.join("cpu");
        assert_eq!(read(&cpu.join("online")), "0-223\n");
        assert_eq!(read(&cpu.join("smt/control")), "on\n");
        assert_eq!(read(&sys.join("node/online")), "0-1\n");
        assert_eq!(read(&sys.join("node/node0/cpulist")), "0-55,112-167\n");
        assert_eq!(read(&sys.join("node/node1/cpulist")), "56-111,168-223\n");
        assert_eq!(read(&sys.join("node/node1/distance")), "21 10\n");
        // CPU 0 and 112 are the two threads of package 0's first core; CPU 56 is
        // package 1's first core (core ids restart per package).
        let t0 = cpu.join("cpu0/topology");
        assert_eq!(read(&t0.join("thread_siblings_list")), "0,112\n");
        assert_eq!(read(&t0.join("core_id")), "0\n");
        assert_eq!(read(&cpu.join("cpu112/topology/core_id")), "0\n");
        assert_eq!(read(&cpu.join("cpu56/topology/core_id")), "0\n");
        assert_eq!(read(&cpu.join("cpu56/topology/physical_package_id")), "1\n");
        assert_eq!(read(&cpu.join("cpu167/topology/core_id")), "55\n");
        assert_eq!(read(&t0.join("package_cpus_list")), "0-55,112-167\n");
        // One L3 per socket.
        let l3 = cpu.join("cpu200/cache/index3");
        assert_eq!(read(&l3.join("level")), "3\n");
        assert_eq!(read(&l3.join("id")), "1\n");
        assert_eq!(read(&l3.join("shared_cpu_list")), "56-111,168-223\n");
        // The node link resolves to the node directory.
        assert_eq!(read(&cpu.join("cpu200/node1/cpulist")), "56-111,168-223\n");
        assert!(sys.join("node/node0/cpu112/topology").is_dir());
        assert!(!cpu.join("cpu200/node0").exists());
    }

    #[test]
    fn epyc_l3_per_ccx() {
        let p = profile("dgx-a100");
        let places = places(&p);
        // EPYC 7742: 4 cores (8 threads) per CCX share one L3; 16 per package.
        let cpu4 = places.iter().find(|c| c.cpu == 4).expect("cpu 4");
        assert_eq!(cpu4.l3_id, 1);
        let same: Vec<u32> = places
            .iter()
            .filter(|c| c.l3_id == 1)
            .map(|c| c.cpu)
            .collect();
        assert_eq!(cpu_list(&same), "4-7,132-135");
        let cpu64 = places.iter().find(|c| c.cpu == 64).expect("cpu 64");
        assert_eq!((cpu64.package, cpu64.core_id, cpu64.l3_id), (1, 0, 16));
    }

    #[test]
    fn cpu_less_nodes_and_no_smt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = write(dir.path(), &profile("gb200")).expect("write");
        assert_eq!(read(&sys.join("cpu/smt/control")), "notsupported\n");
        assert_eq!(read(&sys.join("cpu/online")), "0-143\n");
        assert_eq!(read(&sys.join("node/has_cpu")), "0-1\n");
        assert_eq!(read(&sys.join("node/node2/cpulist")), "\n");
        assert_eq!(
            read(&sys.join("cpu/cpu0/topology/thread_siblings_list")),
            "0\n"
        );
    }

    #[test]
    fn rewriting_keeps_the_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = profile("dgx-h100");
        write(dir.path(), &p).expect("first");
        let sys = write(dir.path(), &p).expect("second");
        assert_eq!(read(&sys.join("cpu/cpu3/node0/cpulist")), "0-55,112-167\n");
    }
}
