//! NVIDIA MIG profile tables and placement geometry (PURE).
//!
//! The built-in table follows the MIG User Guide (see `protocols.md` section 4): A100-40GB,
//! A100-80GB, H100-80GB, H100-94GB (NVL), H200-141GB and A30-24GB. A policy file can add models
//! (B200, GH200, ...) with [`MigModel`] entries of the same shape.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// How the device plugin exposes MIG devices (NVIDIA's MIG strategy): the policy's
/// `mig.strategy`, and what a pod may ask for by `gpu-share/mig-strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// Each profile its own resource, `nvidia.com/mig-<profile>`.
    Mixed,
    /// MIG devices advertised as `nvidia.com/gpu` (the GPU Operator's default).
    Single,
    /// The form of the nodes that offer the profile, or of the pools the policy declares, read
    /// from the cluster at admission ([`crate::inventory::MigOffers`]).
    #[default]
    Auto,
}

/// One GPU instance profile of a MIG-capable GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigProfile {
    /// Profile name as `nvidia-smi` prints it, e.g. `1g.10gb` or `1g.10gb+me`.
    pub name: String,
    /// Memory slices used (the placement axis).
    pub memory_slices: u8,
    /// Compute (SM) slices used.
    pub compute_slices: u8,
    /// How many instances of this profile one GPU can hold at most.
    pub max: u8,
    /// Legal start indexes on the memory-slice axis.
    pub starts: Vec<u8>,
    /// Usable memory in MiB where a capture of `nvidia-smi mig -lgip` is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

/// A MIG-capable GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigModel {
    /// Short model name, e.g. `A100-40GB`.
    pub model: String,
    /// Substrings of the GFD `nvidia.com/gpu.product` label that identify this model.
    #[serde(default)]
    pub products: Vec<String>,
    /// Memory slices per GPU (8 on A100/H100/H200, 4 on A30).
    pub memory_slices: u8,
    /// Compute slices per GPU (7 on A100/H100/H200, 4 on A30).
    pub compute_slices: u8,
    pub profiles: Vec<MigProfile>,
}

impl MigModel {
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Whether `placements` (profile, start) is a legal layout on one GPU: every instance starts
    /// at a legal index and no two memory ranges overlap. Unknown profiles never fit.
    pub fn placement_fits(&self, placements: &[(&str, u8)]) -> bool {
        let mut used = vec![false; usize::from(self.memory_slices)];
        for (name, start) in placements {
            let Some(p) = self.profile(name) else {
                return false;
            };
            if !p.starts.contains(start) {
                return false;
            }
            let end = usize::from(*start) + usize::from(p.memory_slices);
            if end > used.len() {
                return false;
            }
            for slot in &mut used[usize::from(*start)..end] {
                if *slot {
                    return false;
                }
                *slot = true;
            }
        }
        true
    }

    /// Packs `profiles` onto one GPU, placing larger instances first at their highest legal
    /// start (so a later 4g can still take start 0). Returns the placements or `None`.
    pub fn place_all<'a>(&self, profiles: &[&'a str]) -> Option<Vec<(&'a str, u8)>> {
        let mut order: Vec<&'a str> = profiles.to_vec();
        order.sort_by_key(|n| std::cmp::Reverse(self.profile(n).map_or(0, |p| p.memory_slices)));
        let mut placed: Vec<(&'a str, u8)> = Vec::new();
        for name in order {
            let p = self.profile(name)?;
            let start = p.starts.iter().rev().copied().find(|s| {
                let mut trial = placed.clone();
                trial.push((name, *s));
                self.placement_fits(&trial)
            })?;
            placed.push((name, start));
        }
        Some(placed)
    }
}

fn p(
    name: &str,
    mem: u8,
    compute: u8,
    max: u8,
    starts: &[u8],
    memory_mib: Option<u64>,
) -> MigProfile {
    MigProfile {
        name: name.to_string(),
        memory_slices: mem,
        compute_slices: compute,
        max,
        starts: starts.to_vec(),
        memory_mib,
    }
}

/// The seven-profile family shared by A100, H100 and H200: names differ by memory size only.
fn eight_slice_model(
    model: &str,
    products: &[&str],
    names: [&str; 7],
    mib: [Option<u64>; 7],
) -> MigModel {
    const ALL: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    MigModel {
        model: model.to_string(),
        products: products.iter().map(|s| s.to_string()).collect(),
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            p(names[0], 1, 1, 7, ALL, mib[0]),
            p(names[1], 1, 1, 1, ALL, mib[1]),
            p(names[2], 2, 1, 4, &[0, 2, 4, 6], mib[2]),
            p(names[3], 2, 2, 3, &[0, 2, 4], mib[3]),
            p(names[4], 4, 3, 2, &[0, 4], mib[4]),
            p(names[5], 4, 4, 1, &[0], mib[5]),
            p(names[6], 8, 7, 1, &[0], mib[6]),
        ],
    }
}

/// GiB with two decimals as printed by `nvidia-smi mig -lgip`, in MiB.
const fn gib(hundredths: u64) -> Option<u64> {
    Some(hundredths * 1024 / 100)
}

/// The profiles of the 80 GB A100 and H100, which are the same (names, slices, placements and
/// memory): one table for both.
const PROFILES_80GB: [&str; 7] = [
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
];

/// The built-in MIG table (protocols.md section 4).
pub fn builtin_models() -> Vec<MigModel> {
    let a100_80_h100 = [
        gib(975),
        gib(975),
        gib(1962),
        gib(1962),
        gib(3950),
        gib(3950),
        gib(7925),
    ];
    vec![
        eight_slice_model(
            "A100-40GB",
            &["A100-SXM4-40GB", "A100-PCIE-40GB", "A100-40GB"],
            [
                "1g.5gb",
                "1g.5gb+me",
                "1g.10gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb",
            ],
            [
                gib(475),
                gib(475),
                gib(975),
                gib(975),
                gib(1962),
                gib(1962),
                gib(3950),
            ],
        ),
        eight_slice_model(
            "A100-80GB",
            &[
                "A100-SXM4-80GB",
                "A100-80GB-PCIe",
                "A100-PCIE-80GB",
                "A100-80GB",
            ],
            PROFILES_80GB,
            a100_80_h100,
        ),
        eight_slice_model(
            "H100-80GB",
            &["H100-80GB-HBM3", "H100-SXM5-80GB", "H100-PCIe", "H100-80GB"],
            PROFILES_80GB,
            a100_80_h100,
        ),
        eight_slice_model(
            "H100-94GB",
            &["H100-NVL", "H100-94GB"],
            [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb",
            ],
            [
                gib(1075),
                gib(1075),
                gib(2162),
                gib(2162),
                gib(4638),
                gib(4638),
                gib(9312),
            ],
        ),
        eight_slice_model(
            "H200-141GB",
            &["H200"],
            [
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb",
            ],
            [None; 7],
        ),
        MigModel {
            model: "A30-24GB".to_string(),
            products: vec!["A30".to_string()],
            memory_slices: 4,
            compute_slices: 4,
            profiles: vec![
                p("1g.6gb", 1, 1, 4, &[0, 1, 2, 3], gib(581)),
                p("1g.6gb+me", 1, 1, 1, &[0, 1, 2, 3], gib(581)),
                p("2g.12gb", 2, 2, 2, &[0, 2], gib(1169)),
                p("2g.12gb+me", 2, 2, 1, &[0, 2], gib(1169)),
                p("4g.24gb", 4, 4, 1, &[0], gib(2344)),
            ],
        },
    ]
}

/// The device plugin's mixed-strategy resource name for a profile: `+` becomes `.`.
pub fn resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// The mig-parted `all-<profile>` config name, usable as a label value (`+` becomes `.`).
pub fn all_config_name(profile: &str) -> String {
    format!("all-{}", profile.replace('+', "."))
}

/// A MIG table: the built-in models plus whatever the policy adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigTable {
    /// Built-in models (minus those the policy replaces), then the policy's.
    pub models: Vec<MigModel>,
    /// How many of `models`, at the end, come from the policy.
    policy_models: usize,
}

impl Default for MigTable {
    fn default() -> Self {
        MigTable {
            models: builtin_models(),
            policy_models: 0,
        }
    }
}

impl MigTable {
    /// The built-in models plus `extra`; an extra model replaces the built-in (or earlier extra)
    /// of the same name.
    pub fn with_extra(extra: &[MigModel]) -> Self {
        let mut models: Vec<MigModel> = builtin_models()
            .into_iter()
            .filter(|b| !extra.iter().any(|m| m.model == b.model))
            .collect();
        let builtin = models.len();
        for m in extra {
            if let Some(i) = models[builtin..].iter().position(|x| x.model == m.model) {
                models.remove(builtin + i);
            }
            models.push(m.clone());
        }
        let policy_models = models.len() - builtin;
        MigTable {
            models,
            policy_models,
        }
    }

    /// The first model that defines this profile name, with the profile.
    pub fn find(&self, profile: &str) -> Option<(&MigModel, &MigProfile)> {
        self.models
            .iter()
            .find_map(|m| m.profile(profile).map(|p| (m, p)))
    }

    /// The model a GFD product label belongs to (e.g. `NVIDIA-A100-SXM4-80GB`; GKE's
    /// `nvidia-a100-80gb` too: the match ignores case). The policy's
    /// models are searched first; among the models that match, the one with the longest
    /// matching product substring wins (so `NVIDIA-GH200-480GB` is GH200, not H200), the
    /// first listed on a tie.
    pub fn model_for_product(&self, product: &str) -> Option<&MigModel> {
        let product = product.trim_end_matches("-SHARED").to_ascii_lowercase();
        let (builtin, policy) = self
            .models
            .split_at(self.models.len().saturating_sub(self.policy_models));
        let best = |models: &'_ [MigModel]| -> Option<usize> {
            let mut best: Option<(usize, usize)> = None;
            for (i, m) in models.iter().enumerate() {
                let matched = m
                    .products
                    .iter()
                    .filter(|s| !s.is_empty() && product.contains(&s.to_ascii_lowercase()))
                    .map(String::len)
                    .max();
                if let Some(len) = matched
                    && best.is_none_or(|(_, b)| len > b)
                {
                    best = Some((i, len));
                }
            }
            best.map(|(i, _)| i)
        };
        best(policy)
            .map(|i| &policy[i])
            .or_else(|| best(builtin).map(|i| &builtin[i]))
    }

    /// A profile's geometry on a node's model: the model the product label names (the
    /// policy's models first), when that model defines the profile. `None` when the product
    /// is unknown or its model has no such profile: never another model's geometry, since one
    /// name can differ between models (`1g.10gb` is 4 per A100 40GB, 7 per A100 80GB).
    pub fn geometry(
        &self,
        product: Option<&str>,
        profile: &str,
    ) -> Option<(&MigModel, &MigProfile)> {
        let model = self.model_for_product(product?)?;
        model.profile(profile).map(|p| (model, p))
    }

    /// How many devices of `profile` one of the node's GPUs holds at most ([`Self::geometry`]);
    /// with no model known, as many as the profile's compute share allows (`<N>g` of 7).
    pub fn per_gpu(&self, product: Option<&str>, profile: &str) -> u32 {
        match self.geometry(product, profile) {
            Some((_, p)) => u32::from(p.max).max(1),
            None => (GPU_MILLI / compute_share_milli(profile).max(1)).max(1),
        }
    }

    /// A device of `profile`'s share of its GPU in thousandths ([`Self::geometry`]); with no
    /// model known, its `<N>g` out of 7.
    pub fn share_milli(&self, product: Option<&str>, profile: &str) -> u32 {
        match self.geometry(product, profile) {
            Some((m, p)) => mig_share_milli(m, p),
            None => compute_share_milli(profile),
        }
    }

    /// Every profile name, sorted and de-duplicated.
    pub fn profile_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .models
            .iter()
            .flat_map(|m| m.profiles.iter().map(|p| p.name.clone()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Up to three valid profile names closest to `wanted`, for "did you mean" messages.
    pub fn suggestions(&self, wanted: &str) -> Vec<String> {
        let mut scored: Vec<(usize, String)> = self
            .profile_names()
            .into_iter()
            .map(|n| (profile_distance(wanted, &n), n))
            .collect();
        scored.sort();
        let best = scored.first().map_or(0, |(d, _)| *d);
        scored
            .into_iter()
            .filter(|(d, _)| *d <= best + 2)
            .take(3)
            .map(|(_, n)| n)
            .collect()
    }
}

/// Distance between two profile names: the compute part (`7g`) weighs most, then the memory
/// size by numeric difference, then the suffix (`+me`), so `7g.79gb` suggests `7g.80gb`.
fn profile_distance(a: &str, b: &str) -> usize {
    fn parts(s: &str) -> (&str, &str, &str) {
        let (base, suffix) = s.split_once('+').unwrap_or((s, ""));
        let (compute, mem) = base.split_once('.').unwrap_or((base, ""));
        (compute, mem.trim_end_matches("gb"), suffix)
    }
    let (ac, am, asuf) = parts(a);
    let (bc, bm, bsuf) = parts(b);
    let memory = match (am.parse::<i64>(), bm.parse::<i64>()) {
        (Ok(x), Ok(y)) => (x - y).unsigned_abs() as usize,
        _ => 10 * levenshtein(am, bm),
    };
    1000 * levenshtein(ac, bc) + memory + 5 * levenshtein(asuf, bsuf)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// One GPU, in thousandths.
pub const GPU_MILLI: u32 = 1000;

/// A MIG device's share of its GPU in thousandths: its compute slices out of the model's
/// (a `3g.40gb` is 3/7, an A30's `1g.6gb` 1/4).
pub fn mig_share_milli(model: &MigModel, profile: &MigProfile) -> u32 {
    u32::from(profile.compute_slices) * GPU_MILLI / u32::from(model.compute_slices.max(1))
}

/// [`mig_share_milli`] of a profile by name, from the built-in MIG table; a profile the table
/// does not know counts by its `<N>g` prefix out of 7. For demands (a pod's `mig-1g.10gb`),
/// whose node is not known; a node's devices are counted on its model ([`MigTable::share_milli`]).
pub fn mig_profile_milli(profile: &str) -> u32 {
    static TABLE: LazyLock<MigTable> = LazyLock::new(MigTable::default);
    match TABLE.find(profile) {
        Some((m, p)) => mig_share_milli(m, p),
        None => compute_share_milli(profile),
    }
}

/// A profile's `<N>g` out of 7, in thousandths.
fn compute_share_milli(profile: &str) -> u32 {
    let slices: u32 = profile
        .split_once('g')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(7);
    slices.clamp(1, 7) * GPU_MILLI / 7
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100() -> MigModel {
        MigTable::default()
            .models
            .into_iter()
            .find(|m| m.model == "A100-80GB")
            .unwrap()
    }

    #[test]
    fn worked_fits_from_the_guide() {
        let m = a100();
        assert!(m.placement_fits(&[("4g.40gb", 0), ("3g.40gb", 4)]));
        assert!(
            !m.placement_fits(&[("4g.40gb", 0), ("4g.40gb", 4)]),
            "4g only starts at 0"
        );
        assert!(m.placement_fits(&[("3g.40gb", 0), ("3g.40gb", 4)]));
        assert!(!m.placement_fits(&[("3g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 6)]));
        assert!(m.placement_fits(&[
            ("2g.20gb", 0),
            ("2g.20gb", 2),
            ("2g.20gb", 4),
            ("1g.10gb", 6)
        ]));
        assert!(
            !m.placement_fits(&[("1g.10gb", 7)]),
            "1-slice profiles cannot start at 7"
        );
        let seven: Vec<(&str, u8)> = (0..7).map(|i| ("1g.10gb", i)).collect();
        assert!(m.placement_fits(&seven));
        assert!(m.placement_fits(&[
            ("1g.20gb", 0),
            ("1g.20gb", 2),
            ("1g.20gb", 4),
            ("1g.20gb", 6)
        ]));
        assert!(!m.placement_fits(&[("9g.99gb", 0)]));
    }

    #[test]
    fn place_all_puts_big_instances_where_they_leave_room() {
        let m = a100();
        let placed = m
            .place_all(&["1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb"])
            .unwrap();
        assert!(m.placement_fits(&placed));
        assert_eq!(m.place_all(&["4g.40gb", "4g.40gb"]), None);
        assert!(m.place_all(&["1g.10gb"; 7]).is_some());
        assert_eq!(m.place_all(&["1g.10gb"; 8]), None);
    }

    #[test]
    fn names_and_suggestions() {
        let t = MigTable::default();
        assert_eq!(resource_name("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
        assert_eq!(all_config_name("1g.10gb+me"), "all-1g.10gb.me");
        assert!(t.find("1g.18gb").is_some());
        assert!(t.find("1g.12gb").is_some());
        assert!(t.find("4g.24gb").is_some());
        assert!(t.suggestions("7g.79gb").contains(&"7g.80gb".to_string()));
        assert_eq!(
            t.model_for_product("NVIDIA-A100-SXM4-80GB").unwrap().model,
            "A100-80GB"
        );
        assert_eq!(
            t.model_for_product("NVIDIA-H100-80GB-HBM3-SHARED")
                .unwrap()
                .model,
            "H100-80GB"
        );
        assert!(t.model_for_product("Tesla-T4").is_none());
        assert_eq!(t.find("1g.10gb").unwrap().1.memory_mib, Some(9984));
    }

    #[test]
    fn policy_models_replace_or_extend() {
        let extra = MigModel {
            model: "B200".into(),
            products: vec!["B200".into()],
            memory_slices: 8,
            compute_slices: 7,
            profiles: vec![p("1g.23gb", 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6], None)],
        };
        let t = MigTable::with_extra(&[extra]);
        assert!(t.find("1g.23gb").is_some());
        assert!(MigTable::default().find("1g.23gb").is_none());
    }

    #[test]
    fn product_matching_prefers_policy_models_then_the_longest_match() {
        let model = |name: &str, products: &[&str]| MigModel {
            model: name.into(),
            products: products.iter().map(|s| s.to_string()).collect(),
            memory_slices: 8,
            compute_slices: 7,
            profiles: vec![p("1g.12gb", 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6], None)],
        };
        let gh200 = model("GH200-96GB", &["GH200"]);
        let t = MigTable::with_extra(std::slice::from_ref(&gh200));
        for product in ["NVIDIA-GH200-480GB", "NVIDIA-GH200-480GB-SHARED"] {
            assert_eq!(
                t.model_for_product(product).unwrap().model,
                "GH200-96GB",
                "{product}"
            );
        }
        assert_eq!(
            t.model_for_product("NVIDIA-H200").unwrap().model,
            "H200-141GB"
        );
        // Among built-ins and among policy models alike, the longest match wins.
        let t = MigTable::with_extra(&[
            model("Any-H", &["H"]),
            model("GH200-144GB", &["GH200-144GB"]),
        ]);
        assert_eq!(
            t.model_for_product("NVIDIA-GH200-144GB-HBM3e")
                .unwrap()
                .model,
            "GH200-144GB"
        );
        // A policy model, however short its match, is preferred to a built-in.
        assert_eq!(
            t.model_for_product("NVIDIA-H100-80GB-HBM3").unwrap().model,
            "Any-H"
        );
        assert!(MigTable::default().model_for_product("Tesla-T4").is_none());
        // A replaced built-in is not counted twice.
        let t = MigTable::with_extra(&[model("H200-141GB", &["H200-SXM"])]);
        assert_eq!(t.models.len(), MigTable::default().models.len());
        assert_eq!(t.model_for_product("NVIDIA-H200-NVL"), None);
        let t = MigTable::with_extra(&[gh200.clone(), gh200]);
        assert_eq!(t.models.len(), MigTable::default().models.len() + 1);
        assert_eq!(
            t.model_for_product("NVIDIA-GH200-480GB").unwrap().model,
            "GH200-96GB"
        );
    }
}
