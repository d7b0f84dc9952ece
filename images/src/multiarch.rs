//! One image index per component for amd64 and arm64 (issue 39 item 2), and what a release
//! says about its images: an SPDX 2.3 SBOM per image (in the image, and beside the layout) and
//! one in-toto SLSA v1 provenance statement naming every index. Pure: the caller reads the
//! binaries, `cargo metadata` and the package database.
//!
//! Our images hold static binaries (`make images` links them with `+crt-static`), so nothing
//! of the build host but the CA bundle goes in, and that is named with its Debian package.
//! A dynamic binary is accepted only for the build host's own architecture (its libraries
//! come from `ldd`, each named with its Debian package in the SBOM).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Built, ImageError, Meta, SOURCE, rfc3339};

/// A CPU architecture we build for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    #[default]
    Amd64,
    Arm64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// The OCI / Go name (`platform.architecture`).
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// `platform.variant`.
    pub fn variant(self) -> Option<&'static str> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some("v8"),
        }
    }

    /// The Rust target the binaries are built for.
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// ELF `e_machine`.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => object::elf::EM_X86_64,
            Arch::Arm64 => object::elf::EM_AARCH64,
        }
    }

    /// The architecture this program runs on.
    pub fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::Amd64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Result<Arch, String> {
        match s {
            "amd64" | "x86_64" => Ok(Arch::Amd64),
            "arm64" | "aarch64" => Ok(Arch::Arm64),
            other => Err(format!("{other:?} is not amd64 or arm64")),
        }
    }
}

/// What an ELF binary is: its architecture and whether it needs a dynamic loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElfInfo {
    pub machine: u16,
    pub dynamic: bool,
}

/// Reads the ELF header and program headers of `data` (64-bit little-endian, as both our
/// architectures are). `object` does the parsing: bounds-checked, no I/O.
pub fn elf_info(data: &[u8]) -> Result<ElfInfo, String> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data)
        .map_err(|e| format!("not a 64-bit ELF file: {e}"))?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    let phs = header
        .program_headers(endian, data)
        .map_err(|e| format!("program headers: {e}"))?;
    let dynamic = phs
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP);
    Ok(ElfInfo {
        machine: header.e_machine(endian),
        dynamic,
    })
}

/// Checks a binary for an image of `arch`: the right machine, and static unless `arch` is
/// the build host's (whose libraries `ldd` can list).
pub fn check_binary(name: &str, data: &[u8], arch: Arch) -> Result<ElfInfo, ImageError> {
    let info = elf_info(data).map_err(|e| ImageError::Invalid(format!("{name}: {e}")))?;
    if info.machine != arch.elf_machine() {
        return Err(ImageError::Invalid(format!(
            "{name} is built for ELF machine {}, not {} ({}): build it with --target {}",
            info.machine,
            arch.oci(),
            arch.elf_machine(),
            arch.rust_target()
        )));
    }
    if info.dynamic && Arch::host() != Some(arch) {
        return Err(ImageError::Invalid(format!(
            "{name} for {} is dynamically linked: link it statically (RUSTFLAGS=\"-C target-feature=+crt-static\", as make images does)",
            arch.oci()
        )));
    }
    Ok(info)
}

/// An OCI image index of one component's images, one per architecture.
pub fn index(images: &[(Arch, &Built)], meta: &Meta) -> Result<Bytes, ImageError> {
    let manifests: Vec<Value> = images
        .iter()
        .map(|(arch, img)| {
            let mut platform = json!({"architecture": arch.oci(), "os": "linux"});
            if let Some(v) = arch.variant() {
                platform["variant"] = json!(v);
            }
            json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": img.digest(),
                "size": img.manifest.len(),
                "platform": platform,
            })
        })
        .collect();
    let created = rfc3339(meta.created);
    let v = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
        "annotations": {
            "org.opencontainers.image.created": created,
            "org.opencontainers.image.revision": meta.revision,
            "org.opencontainers.image.version": meta.version,
            "org.opencontainers.image.source": SOURCE,
        },
    });
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(|e| ImageError::Invalid(e.to_string()))
}

/// A Rust crate compiled into a binary.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    pub name: String,
    pub version: String,
    /// `registry+https://…` for crates.io, absent for our own.
    pub source: Option<String>,
    pub license: Option<String>,
}

/// A Debian package a file of the image came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deb {
    pub name: String,
    pub version: String,
    pub arch: String,
    /// The files of the image it provides.
    pub files: Vec<String>,
}

/// The crates linked into bin target `bin` for `target`, from `cargo metadata
/// --format-version 1 --filter-platform <target>` output: the package owning the bin, and
/// everything it reaches through normal (not build, not dev) dependencies.
pub fn crates_of(metadata: &Value, bin: &str) -> Result<Vec<Crate>, String> {
    let packages = metadata["packages"].as_array().ok_or("no packages")?;
    let owner = packages
        .iter()
        .find(|p| {
            p["targets"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["name"] == bin
                        && t["kind"]
                            .as_array()
                            .is_some_and(|k| k.iter().any(|k| k == "bin"))
                })
            })
        })
        .ok_or_else(|| format!("no package builds the binary {bin}"))?;
    let by_id: BTreeMap<&str, &Value> = packages
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .ok_or("no resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut seen = BTreeSet::new();
    let mut todo = vec![owner["id"].as_str().ok_or("package without id")?];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = nodes.get(id) else { continue };
        for d in node["deps"].as_array().into_iter().flatten() {
            let normal = d["dep_kinds"]
                .as_array()
                .is_some_and(|ks| ks.iter().any(|k| k["kind"].is_null()));
            if normal && let Some(pkg) = d["pkg"].as_str() {
                todo.push(pkg);
            }
        }
    }
    let mut out: Vec<Crate> = seen
        .iter()
        .filter_map(|id| by_id.get(id))
        .map(|p| Crate {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            version: p["version"].as_str().unwrap_or_default().to_string(),
            source: p["source"].as_str().map(str::to_string),
            license: p["license"].as_str().map(str::to_string),
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

fn spdx_id(kind: &str, name: &str, version: &str) -> String {
    let clean = |s: &str| {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect::<String>()
    };
    format!("SPDXRef-{kind}-{}-{}", clean(name), clean(version))
}

/// The SPDX 2.3 document of one image: the image, the binaries in it (with their SHA-256),
/// the crates each links, and the Debian packages its other files come from. Deterministic
/// (created at `SOURCE_DATE_EPOCH`, namespace from the content).
pub fn sbom(
    image: &str,
    arch: Arch,
    meta: &Meta,
    binaries: &[(String, Vec<u8>, Vec<Crate>)],
    debs: &[Deb],
) -> Result<Vec<u8>, ImageError> {
    let image_id = "SPDXRef-Image".to_string();
    let mut packages = vec![json!({
        "SPDXID": image_id,
        "name": image,
        "versionInfo": meta.version,
        "downloadLocation": "NOASSERTION",
        "supplier": "Organization: hcp-olm",
        "primaryPackagePurpose": "CONTAINER",
        "licenseConcluded": "Apache-2.0",
        "licenseDeclared": "Apache-2.0",
        "copyrightText": "NOASSERTION",
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": format!("pkg:oci/{image}?arch={}&tag=v{}", arch.oci(), meta.version),
        }],
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": image_id,
    })];
    let mut crate_ids = BTreeSet::new();
    for (name, data, crates) in binaries {
        let bin_id = spdx_id("Binary", name, &meta.version);
        packages.push(json!({
            "SPDXID": bin_id,
            "name": name,
            "versionInfo": meta.version,
            "downloadLocation": SOURCE,
            "primaryPackagePurpose": "APPLICATION",
            "licenseConcluded": "Apache-2.0",
            "licenseDeclared": "Apache-2.0",
            "copyrightText": "NOASSERTION",
            "checksums": [{"algorithm": "SHA256", "checksumValue": format!("{:x}", Sha256::digest(data))}],
            "sourceInfo": format!("built from {SOURCE} at {} for {}", meta.revision, arch.rust_target()),
        }));
        relationships.push(json!({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": bin_id}));
        for c in crates {
            let id = spdx_id("Crate", &c.name, &c.version);
            if crate_ids.insert(id.clone()) {
                let mut p = json!({
                    "SPDXID": id,
                    "name": c.name,
                    "versionInfo": c.version,
                    "downloadLocation": match &c.source {
                        Some(s) if s.contains("crates.io") => format!("https://crates.io/api/v1/crates/{}/{}/download", c.name, c.version),
                        _ => "NOASSERTION".to_string(),
                    },
                    "primaryPackagePurpose": "LIBRARY",
                    "licenseConcluded": "NOASSERTION",
                    "licenseDeclared": c.license.clone().unwrap_or_else(|| "NOASSERTION".into()),
                    "copyrightText": "NOASSERTION",
                });
                if c.source.is_some() {
                    p["externalRefs"] = json!([{
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": format!("pkg:cargo/{}@{}", c.name, c.version),
                    }]);
                }
                packages.push(p);
            }
            relationships.push(json!({"spdxElementId": bin_id, "relationshipType": "STATIC_LINK", "relatedSpdxElement": id}));
        }
    }
    for d in debs {
        let id = spdx_id("Deb", &d.name, &d.version);
        packages.push(json!({
            "SPDXID": id,
            "name": d.name,
            "versionInfo": d.version,
            "downloadLocation": "NOASSERTION",
            "supplier": "Organization: Debian",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "comment": format!("files: {}", d.files.join(", ")),
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": format!("pkg:deb/debian/{}@{}?arch={}", d.name, d.version, d.arch),
            }],
        }));
        relationships.push(json!({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": id}));
    }
    let body = json!({"packages": packages, "relationships": relationships});
    let content = format!(
        "{:x}",
        Sha256::digest(serde_json::to_vec(&body).unwrap_or_default())
    );
    let doc = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{image}-{}-v{}", arch.oci(), meta.version),
        "documentNamespace": format!("{SOURCE}/spdx/{image}/{}/{}/{content}", arch.oci(), meta.version),
        "creationInfo": {
            "created": rfc3339(meta.created),
            "creators": [format!("Tool: hcp-olm-images-{}", env!("CARGO_PKG_VERSION"))],
        },
        "packages": body["packages"],
        "relationships": body["relationships"],
    });
    serde_json::to_vec_pretty(&doc).map_err(|e| ImageError::Invalid(e.to_string()))
}

/// One input of the build, named in the provenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub name: String,
    /// `sha256` of its content, where it is a file.
    pub sha256: Option<String>,
    pub uri: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

/// An in-toto v1 statement with an SLSA provenance v1 predicate: `subjects` (name, digest:
/// the image indexes) were packed by hcp-olm-images from the binaries in `bin_dir` (built
/// from `meta.revision`) with `inputs` (each binary by digest, the toolchain, Cargo.lock,
/// the CA bundle). Deterministic.
pub fn provenance(
    subjects: &[(String, String)],
    meta: &Meta,
    targets: &[Arch],
    bin_dir: &str,
    inputs: &[Input],
) -> Result<Vec<u8>, ImageError> {
    let subject: Vec<Value> = subjects
        .iter()
        .map(|(name, digest)| {
            json!({"name": name, "digest": {"sha256": digest.trim_start_matches("sha256:")}})
        })
        .collect();
    let deps: Vec<Value> = inputs
        .iter()
        .map(|i| {
            let mut v = json!({"name": i.name});
            if let Some(d) = &i.sha256 {
                v["digest"] = json!({"sha256": d});
            }
            if let Some(u) = &i.uri {
                v["uri"] = json!(u);
            }
            if !i.annotations.is_empty() {
                v["annotations"] = json!(i.annotations);
            }
            v
        })
        .collect();
    let v = json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subject,
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": format!("{SOURCE}/blob/main/docs/release.md"),
                "externalParameters": {
                    "source": {"uri": format!("git+{SOURCE}"), "digest": {"gitCommit": meta.revision}},
                    "version": meta.version,
                    "targets": targets.iter().map(|a| a.rust_target()).collect::<Vec<_>>(),
                },
                "internalParameters": {"SOURCE_DATE_EPOCH": meta.created, "binDir": bin_dir},
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": format!("{SOURCE}/images (hcp-olm-images {})", env!("CARGO_PKG_VERSION"))},
                "metadata": {"invocationId": format!("{}-{}", meta.revision, meta.created)},
            },
        },
    });
    serde_json::to_vec_pretty(&v).map_err(|e| ImageError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(machine: u16, interp: bool) -> Vec<u8> {
        // A minimal ELF64 LE header with one program header.
        let mut d = vec![0u8; 64 + 56];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2; // 64-bit
        d[5] = 1; // little endian
        d[6] = 1; // version
        d[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        d[18..20].copy_from_slice(&machine.to_le_bytes());
        d[20..24].copy_from_slice(&1u32.to_le_bytes());
        d[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        d[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        d[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        d[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let p_type = if interp {
            object::elf::PT_INTERP
        } else {
            object::elf::PT_LOAD
        };
        d[64..68].copy_from_slice(&p_type.to_le_bytes());
        d
    }

    #[test]
    fn binaries_must_match_the_architecture_and_be_static_when_foreign() {
        let arm_static = elf(object::elf::EM_AARCH64, false);
        let arm_dynamic = elf(object::elf::EM_AARCH64, true);
        let x86_dynamic = elf(object::elf::EM_X86_64, true);
        assert!(check_binary("a", &arm_static, Arch::Arm64).is_ok());
        let e = check_binary("a", &arm_static, Arch::Amd64)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not amd64") && e.contains("--target x86_64"),
            "{e}"
        );
        if Arch::host() == Some(Arch::Amd64) {
            let e = check_binary("a", &arm_dynamic, Arch::Arm64)
                .unwrap_err()
                .to_string();
            assert!(e.contains("dynamically linked"), "{e}");
            assert!(
                check_binary("x", &x86_dynamic, Arch::Amd64)
                    .unwrap()
                    .dynamic
            );
        }
        for bad in [&b"#!/bin/sh\n"[..], &[], &arm_static[..40]] {
            assert!(check_binary("bad", bad, Arch::Arm64).is_err());
        }
    }

    #[test]
    fn the_index_names_each_platform() {
        let meta = Meta {
            version: "0.1.0".into(),
            revision: "abc".into(),
            created: 0,
        };
        let img = |n: &str| Built {
            name: n.into(),
            layers: vec![],
            config: Bytes::from_static(b"{}"),
            manifest: Bytes::from(n.to_string()),
        };
        let (a, b) = (img("a"), img("b"));
        let i: Value =
            serde_json::from_slice(&index(&[(Arch::Amd64, &a), (Arch::Arm64, &b)], &meta).unwrap())
                .unwrap();
        assert_eq!(i["mediaType"], "application/vnd.oci.image.index.v1+json");
        assert_eq!(
            i["manifests"][0]["platform"],
            json!({"architecture": "amd64", "os": "linux"})
        );
        assert_eq!(
            i["manifests"][1]["platform"],
            json!({"architecture": "arm64", "os": "linux", "variant": "v8"})
        );
        assert_eq!(i["manifests"][1]["digest"], b.digest());
    }

    #[test]
    fn crates_follow_normal_dependencies_only() {
        let m = json!({
            "packages": [
                {"id": "app", "name": "app", "version": "1.0.0", "source": null, "license": "Apache-2.0",
                 "targets": [{"name": "app-bin", "kind": ["bin"]}]},
                {"id": "lib", "name": "lib", "version": "2.0.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "license": "MIT",
                 "targets": [{"name": "lib", "kind": ["lib"]}]},
                {"id": "build", "name": "cc", "version": "1.0.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "license": "MIT",
                 "targets": [{"name": "cc", "kind": ["lib"]}]},
                {"id": "dev", "name": "tempfile", "version": "3.0.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "license": "MIT",
                 "targets": [{"name": "tempfile", "kind": ["lib"]}]},
            ],
            "resolve": {"nodes": [
                {"id": "app", "deps": [
                    {"pkg": "lib", "dep_kinds": [{"kind": null}]},
                    {"pkg": "build", "dep_kinds": [{"kind": "build"}]},
                    {"pkg": "dev", "dep_kinds": [{"kind": "dev"}]},
                ]},
                {"id": "lib", "deps": []},
            ]},
        });
        let c = crates_of(&m, "app-bin").unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["app", "lib"]);
        assert!(crates_of(&m, "nope").is_err());
        let doc: Value = serde_json::from_slice(
            &sbom(
                "hcp-olm-x",
                Arch::Arm64,
                &Meta {
                    version: "0.1.0".into(),
                    revision: "abc".into(),
                    created: 0,
                },
                &[("app-bin".into(), b"elf".to_vec(), c)],
                &[Deb {
                    name: "ca-certificates".into(),
                    version: "20230311".into(),
                    arch: "all".into(),
                    files: vec!["/etc/ssl/certs/ca-certificates.crt".into()],
                }],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        let pkgs: Vec<&str> = doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            pkgs,
            ["hcp-olm-x", "app-bin", "app", "lib", "ca-certificates"]
        );
    }
}
