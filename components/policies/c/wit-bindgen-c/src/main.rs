//! `edgeroute-wit-bindgen-c WIT_DIR WORLD OUT_DIR`: the C bindings
//! `wit-bindgen c --world WORLD --out-dir OUT_DIR WIT_DIR` writes (WORLD.h,
//! WORLD.c and WORLD_component_type.o), with wit-bindgen-c's defaults.

use anyhow::{Context, bail};
use std::path::PathBuf;
use wit_bindgen_core::Files;
use wit_bindgen_core::wit_parser::Resolve;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [wit, world, out] = args.as_slice() else {
        bail!("usage: edgeroute-wit-bindgen-c WIT_DIR WORLD OUT_DIR");
    };
    let mut resolve = Resolve::default();
    let (package, _) = resolve
        .push_path(wit)
        .with_context(|| format!("cannot read the WIT package at {wit}"))?;
    let world = resolve
        .select_world(&[package], Some(world))
        .with_context(|| format!("no world {world} in {wit}"))?;

    let mut files = Files::default();
    wit_bindgen_c::Opts::default()
        .build()
        .generate(&mut resolve, world, &mut files)?;

    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, contents) in files.iter() {
        let path = out.join(name);
        std::fs::write(&path, contents)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
