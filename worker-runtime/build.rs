//! Builds `csrc/c10d_shim.cpp` against the libtorch that `tch` links, and
//! makes this crate's binaries find libtorch at run time.
//!
//! * libtorch: torch-sys (a direct dependency for this reason) exports the
//!   library directory it linked as `DEP_TCH_LIBTORCH_LIB`; the headers are
//!   beside it (`<torch>/include`), as in every libtorch layout (the pip
//!   wheel and the C++ zip). The C++11 ABI flag must match libtorch's: it is
//!   asked from the same Python torch-sys asked when `LIBTORCH_USE_PYTORCH`
//!   is set, otherwise `LIBTORCH_CXX11_ABI` (default 1), as torch-sys does.
//! * gloo: libtorch carries gloo's code but not its headers; `GLOO_INCLUDE`
//!   or the system include directory must have them (Debian: `libgloo-dev`).
//! * rpath: torch-sys puts no rpath on final binaries, so without one they
//!   need `LD_LIBRARY_PATH`. `rustc-link-arg` reaches only this package's own
//!   tests, examples and binaries; dependents get the directory as
//!   `DEP_WORKER_RUNTIME_LIBTORCH_LIB` for their own build script.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SHIM: &str = "csrc/c10d_shim.cpp";

fn main() {
    println!("cargo:rerun-if-changed={SHIM}");
    for var in ["GLOO_INCLUDE", "LIBTORCH_USE_PYTORCH", "LIBTORCH_CXX11_ABI"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Err(e) = build() {
        eprintln!("worker-runtime build failed: {e}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let lib_dir = PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").map_err(|_| {
        "DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not report its libtorch \
         (is torch-sys a direct dependency, and did its build succeed?)"
            .to_owned()
    })?);
    let root = lib_dir
        .parent()
        .ok_or_else(|| format!("libtorch lib dir {} has no parent", lib_dir.display()))?;
    let torch_include = root.join("include");
    let header = torch_include.join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp");
    if !header.exists() {
        return Err(format!(
            "{} is missing: this libtorch has no c10d headers",
            header.display()
        ));
    }
    let gloo_include = gloo_include()?;
    let abi = cxx11_abi()?;

    let mut build = cc::Build::new();
    build.cpp(true).pic(true).file(SHIM).flag("-std=c++17");
    // Third-party headers as system headers: their warnings are not ours.
    let mut includes = vec![
        torch_include.clone(),
        torch_include.join("torch/csrc/api/include"),
    ];
    // Naming /usr/include again with -isystem would break libstdc++'s #include_next.
    if gloo_include != Path::new("/usr/include") {
        includes.push(gloo_include);
    }
    for dir in includes {
        build.flag("-isystem").flag(dir.display().to_string());
    }
    build
        .define("USE_C10D_GLOO", None)
        .define("USE_DISTRIBUTED", None)
        .define("USE_C10D", None)
        .define("GLOG_USE_GLOG_EXPORT", None)
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .compile("worker_runtime_c10d_shim");

    // After the shim's static archive, the libraries it calls into (torch-sys
    // links them too; naming them here keeps the order right for the linker).
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    for lib in ["torch_cpu", "torch", "c10"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    println!("cargo:libtorch_lib={}", lib_dir.display());
    Ok(())
}

fn gloo_include() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match env::var_os("GLOO_INCLUDE") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec!["/usr/include".into(), "/usr/local/include".into()],
    };
    candidates
        .into_iter()
        .find(|dir| Path::new(dir).join("gloo/config.h").exists())
        .ok_or_else(|| {
            "gloo headers (gloo/config.h) not found: install them (Debian/Ubuntu: \
             `apt-get install libgloo-dev`) or set GLOO_INCLUDE to the directory \
             that contains gloo/"
                .to_owned()
        })
}

fn cxx11_abi() -> Result<String, String> {
    if env::var_os("LIBTORCH_USE_PYTORCH").is_none() {
        return Ok(env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned()));
    }
    // The interpreter torch-sys uses.
    let python = if env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    };
    let out = Command::new(python)
        .args([
            "-c",
            "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))",
        ])
        .output()
        .map_err(|e| format!("running {python} to read torch's C++ ABI: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !(text == "0" || text == "1") {
        return Err(format!(
            "{python} could not report torch._C._GLIBCXX_USE_CXX11_ABI: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}
