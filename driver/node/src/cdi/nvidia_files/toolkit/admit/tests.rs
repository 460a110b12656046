use super::*;

fn mount(host: &str, container: &str, options: &[&str]) -> Mount {
    Mount {
        host_path: host.into(),
        container_path: container.into(),
        kind: None,
        options: options.iter().map(|o| (*o).to_owned()).collect(),
    }
}

const RO: &[&str] = &["ro", "nosuid", "nodev", "bind"];

fn hook(path: &str, args: &[&str], env: &[&str]) -> Hook {
    Hook {
        hook_name: CREATE_CONTAINER.into(),
        path: path.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: env.iter().map(|e| (*e).to_owned()).collect(),
        timeout: None,
    }
}

fn host() -> Allowed<'static> {
    Allowed {
        driver_root: Path::new("/"),
        hook_path: Path::new("/var/lib/kubelet/plugins/gpu.topodra.dev/nvidia-cdi-hook"),
    }
}

/// What nvcdi writes for a host install (the shape of `nvidia-ctk cdi generate`
/// 1.20 output) is taken whole.
#[test]
fn what_the_toolkit_writes_is_taken_whole() {
    let mounts = vec![
        mount(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15",
            RO,
        ),
        mount("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", RO),
        mount(
            "/lib/firmware/nvidia/570.86.15/gsp_ga10x.bin",
            "/lib/firmware/nvidia/570.86.15/gsp_ga10x.bin",
            RO,
        ),
        mount(
            "/run/nvidia-persistenced/socket",
            "/run/nvidia-persistenced/socket",
            &["nosuid", "nodev", "bind", "noexec"],
        ),
    ];
    let hooks = vec![
        hook(
            "/usr/bin/nvidia-cdi-hook",
            &[
                "nvidia-cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
            ],
            &["NVIDIA_CTK_DEBUG=false"],
        ),
        hook(
            "/usr/bin/nvidia-cdi-hook",
            &[
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                "/usr/lib/x86_64-linux-gnu",
            ],
            &[],
        ),
        hook(
            "/usr/bin/nvidia-ctk",
            &["nvidia-ctk", "hook", "disable-device-node-modification"],
            &[],
        ),
    ];
    let env = vec![
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu".to_owned(),
        "NVIDIA_VISIBLE_DEVICES=void".to_owned(),
    ];
    let (edits, dropped) = admit(env.clone(), mounts.clone(), hooks.clone(), &host());
    assert_eq!(dropped, Vec::<String>::new());
    assert_eq!((edits.mounts, edits.hooks, edits.env), (mounts, hooks, env));
}

#[test]
fn below_a_driver_root_the_container_path_is_the_host_path_without_it() {
    let allowed = Allowed {
        driver_root: Path::new("/opt/drivers/root"),
        hook_path: Path::new("/usr/local/nvidia/toolkit/nvidia-cdi-hook"),
    };
    let operator = mount(
        "/run/nvidia/driver/usr/lib64/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        RO,
    );
    let configured = mount(
        "/opt/drivers/root/usr/lib64/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        RO,
    );
    let on_host = mount("/usr/lib64/libcuda.so.1", "/usr/lib64/libcuda.so.1", RO);
    let same_path = mount(
        "/opt/drivers/root/usr/lib64/libcuda.so.1",
        "/opt/drivers/root/usr/lib64/libcuda.so.1",
        RO,
    );
    let elsewhere = mount(
        "/home/u/usr/lib64/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        RO,
    );
    let taken = vec![operator, configured, on_host];
    let (edits, dropped) = admit(
        vec![],
        [taken.clone(), vec![same_path, elsewhere]].concat(),
        vec![],
        &allowed,
    );
    assert_eq!(edits.mounts, taken);
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    assert!(
        dropped[0].contains("not a place driver files are"),
        "{dropped:?}"
    );
    assert!(
        dropped[1].contains("not a driver file below a driver root"),
        "{dropped:?}"
    );
}

/// What issue 42 found adopted verbatim: each is dropped and named.
#[test]
fn what_driver_files_cannot_be_is_dropped_and_named() {
    let mounts = vec![
        mount("/etc/shadow", "/etc/shadow", RO),
        mount("/", "/", &["rw", "rbind"]),
        mount("/usr/lib/libx.so", "/usr/lib/libx.so", &["rw", "bind"]),
        mount(
            "/usr/lib/libx.so",
            "/usr/lib/libx.so",
            &["ro", "bind", "suid"],
        ),
        mount("/usr/lib", "/usr/lib", RO),
        mount("/usr/lib/../../etc/passwd", "/usr/lib/../../etc/passwd", RO),
        mount("/tmp/void", "/var/run/nvidia-container-devices/void", RO),
        mount(
            "/var/run/nvidia-container-devices/void",
            "/var/run/nvidia-container-devices/void",
            RO,
        ),
        mount("usr/lib/libx.so", "usr/lib/libx.so", RO),
    ];
    let hooks = vec![
        hook("/bin/sh", &["sh", "-c", "id"], &[]),
        hook(
            "/tmp/nvidia-cdi-hook",
            &["nvidia-cdi-hook", "update-ldcache"],
            &[],
        ),
        hook(
            "/usr/bin/nvidia-cdi-hook",
            &["nvidia-cdi-hook", "run-anything"],
            &[],
        ),
        hook("/usr/bin/nvidia-cdi-hook", &["sh", "update-ldcache"], &[]),
        hook(
            "/usr/bin/nvidia-cdi-hook",
            &["nvidia-cdi-hook", "update-ldcache"],
            &["LD_PRELOAD=/tmp/x.so"],
        ),
        Hook {
            hook_name: "prestart".into(),
            ..hook(
                "/usr/bin/nvidia-cdi-hook",
                &["nvidia-cdi-hook", "update-ldcache"],
                &[],
            )
        },
    ];
    let env = vec![
        "LD_PRELOAD=/tmp/x.so".to_owned(),
        "PATH=/tmp".to_owned(),
        "NVIDIA_VISIBLE_DEVICES=all".to_owned(),
        "NVIDIA_CTK_".to_owned(),
    ];
    let (edits, dropped) = admit(env, mounts, hooks, &host());
    assert_eq!(edits, ContainerEdits::default(), "{dropped:#?}");
    assert_eq!(dropped.len(), 19, "{dropped:#?}");
    for (needle, count) in [
        ("not a place driver files are", 3),
        ("not read-only", 1),
        ("an option the toolkit does not write", 1),
        ("not a plain absolute path", 2),
        ("topodra's device list mount", 2),
        ("not the toolkit's hook binary", 1),
        ("not where driver tools are", 1),
        ("a subcommand the toolkit's specs do not run", 1),
        ("argv[0]", 1),
        ("other than NVIDIA_CTK_", 1),
        ("not a createContainer hook", 1),
        ("env \"LD_PRELOAD\"", 1),
        ("topodra's NVIDIA_VISIBLE_DEVICES=void stays", 1),
    ] {
        let n = dropped.iter().filter(|d| d.contains(needle)).count();
        assert_eq!(n, count, "{needle}: {dropped:#?}");
    }
}

#[test]
fn counts_are_bounded() {
    let mounts: Vec<Mount> = (0..MAX_MOUNTS + 3)
        .map(|i| {
            let p = format!("/usr/lib/lib{i}.so");
            mount(&p, &p, RO)
        })
        .collect();
    let (edits, dropped) = admit(vec![], mounts, vec![], &host());
    assert_eq!(edits.mounts.len(), MAX_MOUNTS);
    assert_eq!(dropped.len(), 3);
}
