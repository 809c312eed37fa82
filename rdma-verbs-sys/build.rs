//! Generates the bindings of `rdma-verbs-sys` from the system's rdma-core headers.
//!
//! 1. Finds libibverbs and librdmacm with pkg-config (`PKG_CONFIG_PATH` and the other
//!    variables of the `pkg-config` crate apply), or takes `RDMA_VERBS_SYS_INCLUDE_DIR` and
//!    `RDMA_VERBS_SYS_LIB_DIR` for a prefix without `.pc` files.
//! 2. Runs bindgen over `wrapper.h` (`infiniband/verbs.h`, `rdma/rdma_cma.h`,
//!    `rdma/rdma_verbs.h`), with `wrap_static_fns` so that every `static inline` verb
//!    gets a C wrapper named `<name>__extern`.
//! 3. Compiles those wrappers with `cc` and links them before libibverbs and librdmacm.
//!
//! With `RDMA_VERBS_SYS_PREGENERATED=1` (or on docs.rs) nothing is probed or compiled: the
//! bindings checked in under `src/pregenerated.rs` (rdma-core 44) are used, which is
//! enough for `cargo doc` on a machine without the headers. `cargo xtask bindings`
//! regenerates that file from this build's output; a unit test of the crate fails
//! when the two differ.

use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Types that `rdma_cma.h` uses from the C library; the bindings reuse libc's.
const SOCKET_TYPES: &str = "addrinfo|in6_addr|in_addr|in_addr_t|in_port_t|sa_family_t|sockaddr|\
                            sockaddr_in|sockaddr_in6|sockaddr_storage|socklen_t|timespec";

/// C enums whose values the C side writes (completions, events, queried states):
/// generated as `#[repr(transparent)] struct X(pub u32)` with the values as associated
/// constants, so that a value these headers do not list (a newer kernel, driver or
/// rdma-core) is still a valid Rust value, never undefined behaviour. Their `Debug`
/// prints the C name, or the number for a value without one (see [`EnumNames`]).
const VALUE_ENUMS: &[&str] = &[
    "ibv_wc_status",
    "ibv_wc_opcode",
    "ibv_wr_opcode",
    "ibv_qp_state",
    "ibv_qp_type",
    "ibv_mtu",
    "ibv_port_state",
    "ibv_event_type",
    "ibv_node_type",
    "ibv_transport_type",
    "ibv_mw_type",
    "ibv_mig_state",
    "rdma_cm_event_type",
    "rdma_port_space",
];

/// The constants bindgen saw in each of [`VALUE_ENUMS`], in declaration order; they
/// become each type's `name()` and `Debug`.
#[derive(Clone, Debug, Default)]
struct EnumNames(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

impl bindgen::callbacks::ParseCallbacks for EnumNames {
    fn enum_variant_name(
        &self,
        enum_name: Option<&str>,
        variant: &str,
        _value: bindgen::callbacks::EnumVariantValue,
    ) -> Option<String> {
        let name = enum_name?.trim_start_matches("enum ");
        if VALUE_ENUMS.contains(&name) {
            let mut map = self.0.lock().expect("one bindgen thread");
            let list = map.entry(name.to_string()).or_default();
            if !list.iter().any(|v| v == variant) {
                list.push(variant.to_string());
            }
        }
        None
    }
}

impl EnumNames {
    /// Rust source of `name()` and `Debug` for every type of [`VALUE_ENUMS`].
    fn impls(&self) -> String {
        let map = self.0.lock().expect("one bindgen thread");
        let mut rs = String::new();
        for ty in VALUE_ENUMS {
            let names = map.get(*ty).map(Vec::as_slice).unwrap_or_default();
            rs.push_str(&format!(
                "impl {ty} {{\n    \
                 /// The values these headers name, in declaration order.\n    \
                 const NAMES: &'static [({ty}, &'static str)] = &[\n"
            ));
            for n in names {
                rs.push_str(&format!("        ({ty}::{n}, \"{n}\"),\n"));
            }
            rs.push_str(&format!(
                "    ];\n    \
                 /// The C name of this value, or `None` for a value these headers do not\n    \
                 /// list (a newer kernel, driver or rdma-core may write one).\n    \
                 pub fn name(self) -> Option<&'static str> {{\n        \
                 Self::NAMES.iter().find(|(v, _)| *v == self).map(|&(_, n)| n)\n    \
                 }}\n}}\n\
                 impl ::std::fmt::Debug for {ty} {{\n    \
                 /// The C name, or `{ty}(<number>)` for a value without one.\n    \
                 fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {{\n        \
                 match self.name() {{\n            \
                 Some(name) => f.write_str(name),\n            \
                 None => write!(f, \"{ty}({{}})\", self.0),\n        \
                 }}\n    \
                 }}\n}}\n"
            ));
        }
        rs
    }
}

/// The Debian packages that provide what this build needs.
const PACKAGES: &str = "libibverbs-dev librdmacm-dev libclang-dev pkg-config";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=src/pregenerated.rs");
    for var in [
        "RDMA_VERBS_SYS_PREGENERATED",
        "RDMA_VERBS_SYS_INCLUDE_DIR",
        "RDMA_VERBS_SYS_LIB_DIR",
        "DOCS_RS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(rdma_verbs_sys_pregenerated)");

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if env::var_os("RDMA_VERBS_SYS_PREGENERATED").is_some_and(|v| v != "0")
        || env::var_os("DOCS_RS").is_some()
    {
        println!("cargo:rustc-cfg=rdma_verbs_sys_pregenerated");
        fs::write(out.join("wrapped_fns.rs"), "&[]\n").expect("write wrapped_fns.rs");
        let empty = "/// Empty in a documentation-only build.\n\
                     pub fn layouts() -> Vec<(&'static str, usize, usize)> { Vec::new() }\n";
        fs::write(out.join("layout.rs"), empty).expect("write layout.rs");
        return;
    }

    let (includes, lib_dirs, lib_version) = match locate() {
        Ok(found) => found,
        Err(why) => fail(&format!(
            "cannot find libibverbs/librdmacm: {why}\n\
             Install the development packages: apt-get install {PACKAGES}\n\
             (or point RDMA_VERBS_SYS_INCLUDE_DIR / RDMA_VERBS_SYS_LIB_DIR or PKG_CONFIG_PATH at \
             another rdma-core prefix; RDMA_VERBS_SYS_PREGENERATED=1 builds documentation only)"
        )),
    };

    let wrapper_c = out.join("wrapped_static_fns.c");
    let names = EnumNames::default();
    let builder = bindgen_builder(&includes, &wrapper_c, &names);

    // libclang is loaded at run time; a missing one panics inside bindgen.
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match generated {
        Ok(Ok(bindings)) => bindings,
        Ok(Err(err)) => fail(&format!(
            "bindgen could not parse the rdma-core headers: {err}\n\
             Install the development packages: apt-get install {PACKAGES}"
        )),
        Err(_) => fail(&format!(
            "bindgen could not load libclang (see the panic above).\n\
             Install the development packages: apt-get install {PACKAGES}"
        )),
    };
    let mut text = bindings.to_string();
    text.push_str(&names.impls());
    fs::write(out.join("bindings.rs"), text).expect("write bindings.rs");
    let version = lib_version.unwrap_or_else(|| "unknown".into());
    fs::write(out.join("libibverbs_version.txt"), version).expect("write the version");

    let wrapped = compile_shim(&out, &wrapper_c, &includes, &lib_dirs);
    write_wrapped_list(&out.join("wrapped_fns.rs"), &wrapped);
    fs::write(out.join("layout.rs"), layout_rs()).expect("write layout.rs");
}

/// Include and library directories of libibverbs and librdmacm, and libibverbs's
/// version when pkg-config found it.
type Located = (Vec<PathBuf>, Vec<PathBuf>, Option<String>);

/// bindgen's configuration: which items, which enums are bit sets or open
/// values, libc's pthread and socket types, and the static inline wrappers.
fn bindgen_builder(includes: &[PathBuf], wrapper_c: &Path, names: &EnumNames) -> bindgen::Builder {
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ibv_.*|rdma_.*|_ibv_.*|__ibv_.*|___ibv_.*|ibv_wr_.*")
        .allowlist_type("ibv_.*|rdma_.*|_ibv_.*|verbs_.*")
        .allowlist_var("IBV_.*|RDMA_.*|ibv_.*|RAI_.*")
        .bitfield_enum("ibv_access_flags")
        .bitfield_enum("ibv_send_flags")
        .bitfield_enum("ibv_qp_attr_mask")
        .bitfield_enum("ibv_wc_flags")
        .bitfield_enum("ibv_qp_init_attr_mask")
        .bitfield_enum("ibv_qp_create_send_ops_flags")
        .bitfield_enum("ibv_device_cap_flags")
        .bitfield_enum("ibv_port_cap_flags")
        .bitfield_enum("ibv_create_cq_wc_flags")
        .bitfield_enum("ibv_rereg_mr_flags")
        .bitfield_enum("ibv_srq_attr_mask")
        .bitfield_enum("ibv_mw_bind_flags")
        // Values the C side writes: any number must be representable (see VALUE_ENUMS).
        .newtype_enum(VALUE_ENUMS.join("|"))
        .no_debug(VALUE_ENUMS.join("|"))
        // The pthread types inside `ibv_context` and friends come from libc.
        .blocklist_type("pthread_.*")
        .raw_line("pub use libc::{pthread_cond_t, pthread_mutex_t};")
        // Socket addresses are libc's, so that `std`/libc addresses pass unchanged.
        .blocklist_type(SOCKET_TYPES)
        .raw_line(format!(
            "pub use libc::{{{}}};",
            SOCKET_TYPES.replace('|', ", ")
        ))
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .prepend_enum_name(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(wrapper_c)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(names.clone()));
    for dir in includes {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    builder
}

/// Compiles bindgen's static-inline wrappers and the layout probe into
/// `rdma_verbs_sys_shim`, then links libibverbs and librdmacm; returns the names of
/// the wrapped functions.
fn compile_shim(
    out: &Path,
    wrapper_c: &Path,
    includes: &[PathBuf],
    lib_dirs: &[PathBuf],
) -> Vec<String> {
    // The generated C file calls the inline functions; it needs their headers first.
    let c_path = wrapper_c.with_extension("c");
    let body = fs::read_to_string(&c_path).expect("bindgen wrote the static wrappers");
    let wrapped = wrapped_names(&body);
    // bindgen's file starts with `#include "wrapper.h"`, found through the manifest dir.
    let shim = c_path;
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let layout = out.join("layout.c");
    fs::write(&layout, layout_c()).expect("write layout.c");
    let mut cc = cc::Build::new();
    cc.file(&shim)
        .file(&layout)
        .include(&manifest)
        .warnings(false)
        .flag_if_supported("-Wno-deprecated-declarations");
    for dir in includes {
        cc.include(dir);
    }
    cc.compile("rdma_verbs_sys_shim");

    // After the shim, so that the shim's references resolve against these.
    for dir in lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=ibverbs");
    println!("cargo:rustc-link-lib=dylib=rdmacm");
    wrapped
}

/// Finds the headers and libraries (see the module documentation).
fn locate() -> Result<Located, String> {
    if let Some(inc) = env::var_os("RDMA_VERBS_SYS_INCLUDE_DIR") {
        let libs = env::var_os("RDMA_VERBS_SYS_LIB_DIR")
            .map(|d| vec![PathBuf::from(d)])
            .unwrap_or_default();
        let inc = PathBuf::from(inc);
        if !inc.join("infiniband/verbs.h").exists() {
            return Err(format!(
                "RDMA_VERBS_SYS_INCLUDE_DIR={} has no infiniband/verbs.h",
                inc.display()
            ));
        }
        return Ok((vec![inc], libs, None));
    }
    let mut includes = Vec::new();
    let mut libs = Vec::new();
    let mut version = None;
    for name in ["libibverbs", "librdmacm"] {
        let lib = pkg_config::Config::new()
            .cargo_metadata(false)
            .probe(name)
            .map_err(|e| format!("pkg-config {name}: {e}"))?;
        if name == "libibverbs" {
            version = Some(lib.version);
        }
        includes.extend(lib.include_paths);
        libs.extend(lib.link_paths);
    }
    // pkg-config omits the default /usr/include; check that the headers are there.
    let found = includes
        .iter()
        .chain([PathBuf::from("/usr/include")].iter())
        .any(|d| d.join("infiniband/verbs.h").exists() && d.join("rdma/rdma_cma.h").exists());
    if !found {
        return Err("infiniband/verbs.h or rdma/rdma_cma.h not found".into());
    }
    includes.dedup();
    libs.dedup();
    Ok((includes, libs, version))
}

/// Structures whose size and field offsets the C compiler reports for the layout test.
const LAYOUT: &[(&str, &[&str])] = &[
    ("ibv_device_attr", &["max_qp_wr", "phys_port_cnt"]),
    ("ibv_port_attr", &["lid", "link_layer"]),
    ("ibv_gid_entry", &["gid_type", "ndev_ifindex"]),
    ("ibv_context", &["ops", "mutex", "abi_compat"]),
    ("ibv_pd", &["handle"]),
    ("ibv_mr", &["addr", "lkey", "rkey"]),
    ("ibv_mw", &["rkey", "handle"]),
    ("ibv_cq", &["cqe", "mutex", "comp_events_completed"]),
    ("ibv_comp_channel", &["fd", "refcnt"]),
    ("ibv_srq", &["handle", "events_completed"]),
    (
        "ibv_qp",
        &["qp_num", "state", "qp_type", "events_completed"],
    ),
    ("ibv_qp_init_attr", &["cap", "qp_type", "sq_sig_all"]),
    (
        "ibv_qp_attr",
        &["qp_state", "ah_attr", "alt_ah_attr", "rate_limit"],
    ),
    ("ibv_ah_attr", &["grh", "dlid", "port_num"]),
    ("ibv_global_route", &["dgid", "traffic_class"]),
    ("ibv_sge", &["addr", "lkey"]),
    (
        "ibv_send_wr",
        &["sg_list", "opcode", "send_flags", "wr", "qp_type"],
    ),
    ("ibv_recv_wr", &["next", "sg_list", "num_sge"]),
    (
        "ibv_wc",
        &[
            "status",
            "opcode",
            "byte_len",
            "qp_num",
            "wc_flags",
            "dlid_path_bits",
        ],
    ),
    ("ibv_mw_bind", &["wr_id", "bind_info"]),
    ("ibv_async_event", &["element", "event_type"]),
    (
        "rdma_cm_id",
        &["verbs", "qp", "route", "ps", "port_num", "send_cq", "pd"],
    ),
    ("rdma_cm_event", &["id", "event", "status", "param"]),
    (
        "rdma_conn_param",
        &["private_data", "rnr_retry_count", "qp_num"],
    ),
    ("rdma_addrinfo", &["ai_src_addr", "ai_route", "ai_next"]),
];

/// C source that records `sizeof` and `offsetof` of [`LAYOUT`] as globals.
fn layout_c() -> String {
    let mut c = String::from("#include \"wrapper.h\"\n#include <stddef.h>\n");
    for (ty, fields) in LAYOUT {
        c.push_str(&format!(
            "const size_t rdma_verbs_sys_sizeof_{ty} = sizeof(struct {ty});\n"
        ));
        for f in *fields {
            c.push_str(&format!(
                "const size_t rdma_verbs_sys_offsetof_{ty}__{f} = offsetof(struct {ty}, {f});\n"
            ));
        }
    }
    c
}

/// Rust test code comparing bindgen's layout with the C compiler's (see [`layout_c`]).
fn layout_rs() -> String {
    let mut rs = String::from("extern \"C\" {\n");
    for (ty, fields) in LAYOUT {
        rs.push_str(&format!("    static rdma_verbs_sys_sizeof_{ty}: usize;\n"));
        for f in *fields {
            rs.push_str(&format!(
                "    static rdma_verbs_sys_offsetof_{ty}__{f}: usize;\n"
            ));
        }
    }
    rs.push_str("}\n\n/// `(what, size or offset in Rust, the same in C)`.\n");
    rs.push_str("pub fn layouts() -> Vec<(&'static str, usize, usize)> {\n");
    rs.push_str("    // SAFETY: the statics are constants defined in layout.c.\n");
    rs.push_str("    unsafe {\n        vec![\n");
    for (ty, fields) in LAYOUT {
        rs.push_str(&format!(
            "            (\"sizeof {ty}\", ::core::mem::size_of::<{ty}>(), rdma_verbs_sys_sizeof_{ty}),\n"
        ));
        for f in *fields {
            rs.push_str(&format!(
                "            (\"offsetof {ty}.{f}\", ::core::mem::offset_of!({ty}, {f}), \
                 rdma_verbs_sys_offsetof_{ty}__{f}),\n"
            ));
        }
    }
    rs.push_str("        ]\n    }\n}\n");
    rs
}

/// Names of the C functions that bindgen wrapped (`<name>__extern` definitions).
fn wrapped_names(c_source: &str) -> Vec<String> {
    let mut names: Vec<String> = c_source
        .lines()
        .filter_map(|line| {
            let end = line.find("__extern(")?;
            let start = line[..end]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            Some(line[start..end].to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Writes `&[(name, address)]` of every wrapped function, for the link test.
fn write_wrapped_list(path: &Path, names: &[String]) {
    let mut text = String::from("&[\n");
    for name in names {
        text.push_str(&format!("    (\"{name}\", {name} as *const ()),\n"));
    }
    text.push_str("]\n");
    fs::write(path, text).expect("write wrapped_fns.rs");
}

/// Stops the build with a message a person can act on.
fn fail(message: &str) -> ! {
    eprintln!("\nerror: rdma-verbs-sys: {message}\n");
    for line in message.lines() {
        println!("cargo:warning=rdma-verbs-sys: {line}");
    }
    std::process::exit(1);
}
