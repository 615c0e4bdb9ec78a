//! Gives the shared library the soname `libkvdrain.so.<major>` that `make install` installs
//! it under, so programs linked through `pkg-config` find it at run time by that name.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvdrain.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
