//! Builds the guest components in `components/` (a cargo workspace of its
//! own) for wasm32-wasip2, copies the `.wasm` files into `OUT_DIR` and tells
//! the host where they are: `env!("EDGEROUTE_COMPONENTS_DIR")`, and for the
//! tests, one constant per component in `OUT_DIR/components.rs`.
//!
//! The nested cargo gets a target dir of its own: cargo holds a lock on its
//! target dir for the whole build, so a nested build in the outer one would
//! wait for itself forever.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const WASM_TARGET: &str = "wasm32-wasip2";

/// Each component's source folder (under components/) and file name.
const COMPONENTS: &[(&str, &str)] = &[
    ("policy-default", "policy_default.wasm"),
    ("policy-bandit", "policy_bandit.wasm"),
    ("local-worker", "local_worker.wasm"),
    ("cloud-fetch", "cloud_fetch.wasm"),
    ("policy-host-spin", "policy_host_spin.wasm"),
    ("fixtures/policy-always-cloud", "policy_always_cloud.wasm"),
    ("fixtures/policy-cloud-v2", "policy_cloud_v2.wasm"),
    ("fixtures/policy-trap", "policy_trap.wasm"),
    ("fixtures/policy-loop", "policy_loop.wasm"),
    ("fixtures/policy-counter", "policy_counter.wasm"),
    ("fixtures/policy-counter-v2", "policy_counter_v2.wasm"),
    ("fixtures/policy-features-echo", "policy_features_echo.wasm"),
    ("fixtures/policy-wrong-world", "policy_wrong_world.wasm"),
    ("fixtures/cloud-fetch-snoop", "cloud_fetch_snoop.wasm"),
];

/// Variables the outer build sets that would change the nested one. The
/// outer flags are for the host (e.g. `-C target-cpu=native` from
/// .cargo/config.toml reaches build scripts as CARGO_ENCODED_RUSTFLAGS) and
/// break a wasm build; clippy's wrapper would lint the guests on every build.
/// The jobserver (CARGO_MAKEFLAGS) stays, so both builds share the same -j.
const DROP_VARS: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_BUILD_RUSTDOCFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
];
/// Per-package variables of this build script; meaningless to the nested
/// build (and `__CARGO_*` are cargo internals, e.g. from `cargo fix`).
const DROP_PREFIXES: &[&str] = &["CARGO_CFG_", "CARGO_FEATURE_", "CARGO_PKG_", "__CARGO_"];

fn main() {
    let host_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = host_dir
        .parent()
        .expect("host/ lives inside the repository");
    let components = repo.join("components");
    let manifest = components.join("Cargo.toml");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));

    // Not components/ as a whole: an in-tree components/target would make
    // every build look stale.
    println!("cargo:rerun-if-changed={}", manifest.display());
    println!(
        "cargo:rerun-if-changed={}",
        components.join("Cargo.lock").display()
    );
    for (dir, _) in COMPONENTS {
        println!("cargo:rerun-if-changed={}", components.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", repo.join("wit").display());
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS");

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    check_wasm_target(&rustc);

    // OUT_DIR is <target>/[<triple>/]<profile>/build/edgeroute-<hash>/out:
    // put the guests' target dir beside the profiles, so it outlives changes
    // to this package's hash and is shared by debug and release host builds.
    let wasm_target_dir = out_dir
        .ancestors()
        .nth(4)
        .map(|target| target.join("wasm-components"))
        .unwrap_or_else(|| out_dir.join("wasm-components"));

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .current_dir(&components)
        .args(["build", "--release", "--locked", "--target", WASM_TARGET])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&wasm_target_dir)
        // Cargo reads build script stdout for `cargo:` lines; keep the
        // nested build's output out of it.
        .stdout(std::io::stderr());
    for (key, _) in env::vars_os() {
        let name = key.to_string_lossy();
        if DROP_VARS.contains(&name.as_ref()) || DROP_PREFIXES.iter().any(|p| name.starts_with(p)) {
            command.env_remove(&key);
        }
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", Path::new(&cargo).display()));
    if !status.success() {
        panic!(
            "building the guest components failed ({status}); the errors are above. \
             To reproduce: cargo build --release --target {WASM_TARGET} --manifest-path {}",
            manifest.display()
        );
    }

    let built = wasm_target_dir.join(WASM_TARGET).join("release");
    let dest = out_dir.join("components");
    fs::create_dir_all(&dest).expect("create OUT_DIR/components");
    for (dir, file) in COMPONENTS {
        let from = built.join(file);
        fs::copy(&from, dest.join(file)).unwrap_or_else(|e| {
            panic!(
                "components/{dir} should have produced {}: {e}",
                from.display()
            )
        });
    }
    println!(
        "cargo:rustc-env=EDGEROUTE_COMPONENTS_DIR={}",
        dest.display()
    );
    write_component_paths(&dest, &out_dir.join("components.rs"));
}

/// Writes `OUT_DIR/components.rs`: one `&str` constant per component with
/// the absolute path of its `.wasm` (`policy_trap.wasm` → `POLICY_TRAP`),
/// and `ALL`, every (source folder, path) pair. The end-to-end tests
/// `include!` it instead of spelling file names.
fn write_component_paths(dest: &Path, file: &Path) {
    let mut code = String::from(
        "// Generated by host/build.rs from its COMPONENTS table: where each guest\n\
         // component was built.\n",
    );
    let mut all = String::new();
    for (dir, wasm) in COMPONENTS {
        let name = wasm.trim_end_matches(".wasm").to_ascii_uppercase();
        let path = dest.join(wasm);
        let path = path.to_str().expect("OUT_DIR is UTF-8");
        code.push_str(&format!(
            "/// Built from `components/{dir}`.\npub const {name}: &str = {path:?};\n"
        ));
        all.push_str(&format!("    ({dir:?}, {name}),\n"));
    }
    code.push_str(&format!(
        "/// Every component: its source folder under `components/` and its path.\n\
         pub const ALL: &[(&str, &str)] = &[\n{all}];\n"
    ));
    fs::write(file, code).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
}

/// Fails early, with the fix, when rustup has no wasm32-wasip2 standard
/// library: the compiler's own error ("can't find crate for `core`") hides it.
fn check_wasm_target(rustc: &OsString) {
    let output = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", WASM_TARGET])
        .output();
    let installed = match output {
        Ok(out) if out.status.success() => {
            let libdir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            fs::read_dir(&libdir).is_ok_and(|mut entries| entries.next().is_some())
        }
        _ => false,
    };
    if !installed {
        panic!(
            "the {WASM_TARGET} target is not installed; the guest components need it. \
             Run `rustup target add {WASM_TARGET}` and build again."
        );
    }
}
