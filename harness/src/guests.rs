//! The guest components (`guest-jobs/`, built for wasm32-wasip2).
//!
//! They are built once per build, as an explicit step: `./dev guests` (which `./dev test`
//! runs before `cargo test`) for the tests, [`build`] as the first step of the benchmarks.
//! A test only locates them ([`guests`]); it never runs cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What to do when a guest is missing.
const BUILD_HINT: &str = "guest components not built: run `./dev guests` (cargo build --target wasm32-wasip2 in guest-jobs)";

/// A cargo profile of the guest build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// `cargo build` (what the tests use).
    Debug,
    /// `cargo build --release` (what the benchmarks use).
    Release,
}

impl Profile {
    fn dir_name(self) -> &'static str {
        match self {
            Profile::Debug => "debug",
            Profile::Release => "release",
        }
    }
}

/// A directory of built guest components (`<crate>.wasm`).
#[derive(Clone, Debug)]
pub struct Guests {
    dir: PathBuf,
}

impl Guests {
    /// The directory holding the `.wasm` files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `.wasm` of guest crate `name` (with `_` for `-`: crate `my-job` builds `my_job`);
    /// panics, saying how to build the guests, if it does not exist.
    pub fn wasm(&self, name: &str) -> PathBuf {
        let p = self.dir.join(format!("{name}.wasm"));
        assert!(p.exists(), "{BUILD_HINT}; missing {}", p.display());
        p
    }
}

/// The debug guests, located (never built): `$LEASEHOLD_GUESTS_DIR` if set, else
/// `<guests target>/wasm32-wasip2/debug` (see [`target_dir`]). A missing `.wasm` panics in
/// [`Guests::wasm`].
pub fn guests() -> Guests {
    if let Some(dir) = std::env::var_os("LEASEHOLD_GUESTS_DIR").filter(|d| !d.is_empty()) {
        return Guests {
            dir: crate::repo_root().join(dir),
        };
    }
    Guests {
        dir: profile_dir(Profile::Debug),
    }
}

/// Cargo's target directory for the guests: `$CARGO_TARGET_DIR/guests` if set (relative to the
/// repository root when relative), else `<repo>/target/guests` — where `./dev` builds them.
pub fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(
            || crate::repo_root().join("target"),
            |d| crate::repo_root().join(d),
        );
    target.join("guests")
}

fn profile_dir(profile: Profile) -> PathBuf {
    target_dir().join("wasm32-wasip2").join(profile.dir_name())
}

/// Builds every guest with `profile` into [`target_dir`] (cargo's output shown as it goes) and
/// returns them. An explicit build step, for programs that own their build (the benchmarks);
/// tests use [`guests`]. Panics if the build fails.
pub fn build(profile: Profile) -> Guests {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(crate::repo_root().join("guest-jobs"))
        .arg("build");
    if profile == Profile::Release {
        cmd.arg("--release");
    }
    let status = cmd
        .args(["--target", "wasm32-wasip2", "--target-dir"])
        .arg(target_dir())
        // The host build's flags are not for the guests.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .expect("running cargo to build the guests");
    assert!(
        status.success(),
        "building guest-jobs failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)"
    );
    Guests {
        dir: profile_dir(profile),
    }
}

/// The componentize-py that builds the Python jobs: `$LEASEHOLD_COMPONENTIZE_PY` if set, else
/// the one `./dev` installs in `<target>/pyenv` (pinned there); panics, saying how to install
/// it, when it is missing.
pub fn componentize_py() -> PathBuf {
    let path = std::env::var_os("LEASEHOLD_COMPONENTIZE_PY")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            target_dir()
                .parent()
                .expect("the guests' target directory has a parent")
                .join("pyenv/bin/componentize-py")
        });
    assert!(
        path.exists(),
        "componentize-py not found at {}: `./dev guests` installs it (or set LEASEHOLD_COMPONENTIZE_PY)",
        path.display()
    );
    path
}
