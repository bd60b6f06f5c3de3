//! Links Debian's LevelDB (`libleveldb-dev`) and the snappy it was built
//! with (`libsnappy-dev`) statically into the extension (`src/level.rs`), so
//! that it carries its own LevelDB as plyvel's wheels do; only libstdc++ is
//! loaded from the system.

use std::path::Path;

const LIBRARIES: [(&str, &str); 2] = [("leveldb", "libleveldb-dev"), ("snappy", "libsnappy-dev")];
const DIRECTORIES: [&str; 3] = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for (name, package) in LIBRARIES {
        let archive = format!("lib{name}.a");
        if !DIRECTORIES.iter().any(|dir| Path::new(dir).join(&archive).exists()) {
            panic!("{archive} not found in {DIRECTORIES:?}: install {package} (make apt does)");
        }
        println!("cargo:rustc-link-lib=static={name}");
    }
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
