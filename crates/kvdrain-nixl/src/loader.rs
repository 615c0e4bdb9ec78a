//! Makes the real `libnixl_capi.so` loadable without `LD_LIBRARY_PATH`.
//!
//! `nixl-sys` is built with `stub-api`: every `nixl_capi_*` call goes through a stub that, on
//! first use, does a one-shot, cached `dlopen("libnixl_capi.so")` by soname and **aborts the
//! process** if that fails. [`ensure_nixl`] must therefore run before any other `nixl_sys` call
//! (including `nixl_sys::is_stub()`, which itself triggers the cached lookup). It dlopens the
//! library by absolute path with `RTLD_NOW | RTLD_GLOBAL`; the stub's later by-soname `dlopen`
//! then finds the already loaded object. Everything else (libnixl, UCX, plugins) is found through
//! the library's RPATH.
//!
//! Search order:
//! 1. `KVDRAIN_NIXL_LIB`: a path to `libnixl_capi.so`, or to a directory holding it (the wheel's
//!    `.nixl_cu12.mesonpy.libs/` or the install root `.nixl/`). When set, it is the only
//!    candidate.
//! 2. `<repo>/.nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so` (what `scripts/setup-nixl.sh`
//!    installs), with `<repo>` found from this crate's manifest directory at compile time, then
//!    by walking up from the current executable and from the current directory.
//! 3. Whatever the dynamic loader finds by soname (`LD_LIBRARY_PATH`, system paths).

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable overriding where `libnixl_capi.so` is looked up.
pub const NIXL_LIB_ENV: &str = "KVDRAIN_NIXL_LIB";
/// Environment variable that turns real-NIXL tests into loud skips (see [`require_nixl_or_skip`]).
pub const SKIP_ENV: &str = "KVDRAIN_SKIP_NIXL";
/// File name (and soname) of the NIXL C API library.
pub const CAPI_LIB: &str = "libnixl_capi.so";
/// Directory of the wheel's shared libraries, relative to the install root.
pub const WHEEL_LIB_DIR: &str = ".nixl_cu12.mesonpy.libs";
/// Project-local install root, relative to the repository root.
pub const INSTALL_DIR: &str = ".nixl";

/// How to fix a missing runtime; part of every [`NixlLoadError`] message.
pub const INSTALL_HINT: &str = "install the NIXL runtime with `scripts/setup-nixl.sh` (or `make setup`), \
which unpacks the nixl-cu12==1.5.1 wheel into <repo>/.nixl/ (needs network access to PyPI); \
or set KVDRAIN_NIXL_LIB to libnixl_capi.so or its directory";

/// Why the real NIXL library could not be made available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NixlLoadError {
    /// `KVDRAIN_NIXL_LIB` is set but names no `libnixl_capi.so`.
    #[error("{NIXL_LIB_ENV}={value} does not name {CAPI_LIB} or a directory containing it; {hint}", hint = INSTALL_HINT)]
    BadEnvPath {
        /// The variable's value.
        value: String,
    },
    /// No candidate file exists and the dynamic loader cannot find the library either.
    #[error("NIXL runtime not found: no {CAPI_LIB} at {searched}, and none on the loader path ({dlerror}); {hint}", hint = INSTALL_HINT)]
    NotFound {
        /// The candidate paths that were checked, comma-separated.
        searched: String,
        /// `dlerror()` of the by-soname attempt.
        dlerror: String,
    },
    /// A candidate exists but could not be loaded (missing dependency, wrong glibc, ...).
    #[error("NIXL runtime found but failed to load: {attempts}; {hint}", hint = INSTALL_HINT)]
    LoadFailed {
        /// `path: dlerror` for every failed attempt, separated by `; `.
        attempts: String,
    },
    /// The library was loaded but `nixl-sys` still resolves to its stub.
    #[error("loaded {path} but nixl-sys still reports the stub API (another copy was looked up first?); {hint}", hint = INSTALL_HINT)]
    StillStub {
        /// The library that was loaded.
        path: PathBuf,
    },
}

/// Makes the real NIXL library available to `nixl-sys`, once per process.
///
/// Returns the absolute path of the loaded `libnixl_capi.so`. Call it before any other
/// `nixl_sys` function; after an `Err`, no `nixl_sys` function may be called (they abort).
/// The result (success or failure) is computed once and cached.
pub fn ensure_nixl() -> Result<&'static Path, NixlLoadError> {
    static LOADED: OnceLock<Result<PathBuf, NixlLoadError>> = OnceLock::new();
    LOADED.get_or_init(load).as_deref().map_err(Clone::clone)
}

/// Test support: returns `true` when real NIXL is available, `false` (after printing a loud
/// skip line naming `test`) when `KVDRAIN_SKIP_NIXL=1` is set and it is not, and panics with
/// the loader's message otherwise.
#[track_caller]
pub fn require_nixl_or_skip(test: &str) -> bool {
    match ensure_nixl() {
        Ok(_) => true,
        Err(e) if skip_requested() => {
            eprintln!(
                "\n!!!!!!!! SKIPPED {test}: real NIXL unavailable and {SKIP_ENV}=1 is set !!!!!!!!\n\
                 !!!!!!!! reason: {e}\n"
            );
            false
        }
        Err(e) => panic!("{test}: {e} (set {SKIP_ENV}=1 to skip real-NIXL tests)"),
    }
}

fn skip_requested() -> bool {
    std::env::var_os(SKIP_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Candidate paths in search order, and whether they come from `KVDRAIN_NIXL_LIB` (then no
/// other location is tried); `Err` if that variable is set but names no library.
fn candidates() -> Result<(Vec<PathBuf>, bool), NixlLoadError> {
    if let Some(value) = std::env::var_os(NIXL_LIB_ENV).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&value);
        let found = if p.is_dir() {
            [p.join(CAPI_LIB), p.join(WHEEL_LIB_DIR).join(CAPI_LIB)]
                .into_iter()
                .find(|c| c.is_file())
        } else if p.is_file() {
            Some(p)
        } else {
            None
        };
        return found.map(|p| (vec![absolute(&p)], true)).ok_or_else(|| {
            NixlLoadError::BadEnvPath {
                value: value.to_string_lossy().into_owned(),
            }
        });
    }

    let rel = Path::new(INSTALL_DIR).join(WHEEL_LIB_DIR).join(CAPI_LIB);
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        let p = absolute(&p);
        if !out.contains(&p) {
            out.push(p);
        }
    };
    // The crate lives at <repo>/crates/kvdrain-nixl.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    push(manifest.join("../..").join(&rel));
    let starts = [
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf)),
        std::env::current_dir().ok(),
    ];
    for start in starts.into_iter().flatten() {
        for dir in start.ancestors() {
            let c = dir.join(&rel);
            if c.is_file() {
                push(c);
                break;
            }
        }
    }
    Ok((out, false))
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

fn load() -> Result<PathBuf, NixlLoadError> {
    let (candidates, explicit) = candidates()?;
    let mut failures = Vec::new();
    let mut loaded = None;
    for c in candidates.iter().filter(|c| c.is_file()) {
        match dlopen_global(c.as_os_str().as_bytes()) {
            Ok(_) => {
                loaded = Some(c.clone());
                break;
            }
            Err(e) => failures.push(format!("{}: {e}", c.display())),
        }
    }
    let path = match loaded {
        Some(p) => p,
        None if explicit => {
            return Err(NixlLoadError::LoadFailed {
                attempts: failures.join("; "),
            });
        }
        None => {
            // Last resort: the loader's own search path (LD_LIBRARY_PATH, ld.so.cache).
            match dlopen_global(CAPI_LIB.as_bytes()) {
                Ok(file) => file.map_or_else(|| PathBuf::from(CAPI_LIB), |f| absolute(&f)),
                Err(dlerror) if failures.is_empty() => {
                    let searched = candidates
                        .iter()
                        .map(|c| c.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(NixlLoadError::NotFound { searched, dlerror });
                }
                Err(_) => {
                    return Err(NixlLoadError::LoadFailed {
                        attempts: failures.join("; "),
                    });
                }
            }
        }
    };
    // Only now is it safe to touch nixl-sys: the stub's one-shot dlopen finds our library.
    if nixl_sys::is_stub() {
        return Err(NixlLoadError::StillStub { path });
    }
    Ok(path)
}

/// `dlopen(name, RTLD_NOW | RTLD_GLOBAL)`; the handle is intentionally never closed, so the
/// library stays loaded for the life of the process. On success returns the file the loader
/// actually mapped (via `dladdr` on one of its symbols), when it can tell.
fn dlopen_global(name: &[u8]) -> Result<Option<PathBuf>, String> {
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the calls; `info` is plain
    // old data that `dladdr` fills in; every returned C string (`dlerror`, `dli_fname`) is
    // checked for NULL and copied before any further dl* call can invalidate it. Loading runs
    // the library's constructors: we only load the NIXL C API library (or the file the user
    // named in KVDRAIN_NIXL_LIB), i.e. the code nixl-sys would dlopen anyway.
    unsafe {
        let handle = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        if handle.is_null() {
            let e = libc::dlerror();
            return Err(if e.is_null() {
                "unknown dlopen error".to_owned()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            });
        }
        let sym = libc::dlsym(handle, c"nixl_capi_is_stub".as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        if sym.is_null() || libc::dladdr(sym, &mut info) == 0 || info.dli_fname.is_null() {
            return Ok(None);
        }
        let file = CStr::from_ptr(info.dli_fname).to_bytes();
        Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(file))))
    }
}
