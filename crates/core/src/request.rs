//! The `gpu-share` annotation grammar (PURE): annotation values -> [`GpuRequest`], errors in words.
//!
//! ```text
//! gpu-share: mig-<profile>          e.g. mig-1g.10gb, mig-1g.10gb+me, mig-3g.40gb
//! gpu-share: mps-<percent>          1..=100: at least that share of one GPU's SMs (MPS)
//! gpu-share: timeslice-<percent>    1..=100: a declared share of one GPU's time (no isolation)
//! gpu-share: exclusive | exclusive-<n>
//! gpu-share/memory: <quantity>      memory budget of mps / timeslice, e.g. 12Gi
//! gpu-share/container: <name>       the container that gets the GPU (default: the first)
//! gpu-share/count: <n>              MIG instances (default 1)
//! ```
//!
//! The normalized form written to `gpu-share.io/request` is `<class>[,memory=<MiB>Mi][,count=<n>]`,
//! e.g. `timeslice-50,memory=12288Mi` or `mig-1g.10gb,count=2`.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

/// The annotation that asks for a GPU.
pub const ANNOTATION: &str = "gpu-share";
pub const ANNOTATION_MEMORY: &str = "gpu-share/memory";
pub const ANNOTATION_CONTAINER: &str = "gpu-share/container";
pub const ANNOTATION_COUNT: &str = "gpu-share/count";
/// A MIG pod's own choice of NVIDIA's MIG strategy, `single` or `mixed`: the form it asks for its
/// device in (`nvidia.com/gpu` or `nvidia.com/mig-<profile>`), whatever the policy says.
pub const ANNOTATION_MIG_STRATEGY: &str = "gpu-share/mig-strategy";
/// The normalized request the webhook writes and the extender reads.
pub const ANNOTATION_REQUEST: &str = "gpu-share.io/request";
/// On a pod in per-GPU form, the ConfigMap (in the pod's namespace) whose key [`DEVICES_KEY`]
/// its container reads `NVIDIA_VISIBLE_DEVICES` from; written by the webhook, filled by
/// gpu-share once the pod's GPU is held.
pub const ANNOTATION_DEVICES: &str = "gpu-share.io/devices-configmap";
/// The key of that ConfigMap: the UUID of the pod's GPU (or, for an MPS share, its GPU's MPS
/// CDI device `gpu-share.io/mps=<UUID>`).
pub const DEVICES_KEY: &str = "NVIDIA_VISIBLE_DEVICES";
/// The key a time-sliced share reads instead where the policy's `perGpu.timesliceCdi` is on:
/// its GPU's CDI device `gpu-share.io/gpu=<UUID>`, which only a reservation that wrote the
/// device fills (a share whose GPU has none never starts). A key of its own, so that a share
/// admitted for the bare UUID (the legacy runtime) and one admitted for the CDI device each
/// get only what its runtime reads.
pub const CDI_DEVICE_KEY: &str = "CDI_DEVICE";
/// The resource a pod in per-GPU form asks for (one unit): no node advertises it, so it is not
/// a device. It is what makes kube-scheduler send the pod to the extender (a `managedResources`
/// entry with `ignoredByScheduler: true`, so kube-scheduler's own fit check skips it), and kubelet
/// drops an extended resource its node does not advertise before its own fit check.
pub const RESOURCE_SHARE: &str = "gpu-share.io/shared-gpu";

/// The quantity every gpu-share pod carries, in thousandths of a GPU, as an extended resource of
/// its GPU container (limits, which requests default to): `mps-25` 250, `mig-3g.40gb` 428,
/// `exclusive-2` 2000 ([`GpuRequest::gpu_milli`]). ResourceQuota (`requests.gpu-share.io/gpu-milli`)
/// and Kueue count it as they count any resource. No node advertises it: kube-scheduler skips it
/// (the extender's `managedResources`, `ignoredByScheduler: true`), and kubelet drops an extended
/// resource its node does not advertise before its own fit check, as for [`RESOURCE_SHARE`].
pub const RESOURCE_GPU_MILLI: &str = "gpu-share.io/gpu-milli";

/// The valid forms, listed in every parse denial.
pub const VALID_FORMS: &str = "valid forms: mig-<profile> (e.g. mig-1g.10gb), mps-<1..100>, \
    timeslice-<1..100>, exclusive, exclusive-<n>";

/// Largest whole-GPU count one pod may ask for (the largest GPU nodes hold 8; 16 leaves room).
pub const MAX_EXCLUSIVE: u32 = 16;
/// Largest MIG instance count per pod (7 per GPU x 8 GPUs).
pub const MAX_MIG_COUNT: u32 = 56;

/// Isolation class kinds, as named in policies and metrics.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ClassKind {
    Mig,
    Mps,
    Timeslice,
    Exclusive,
}

impl ClassKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClassKind::Mig => "mig",
            ClassKind::Mps => "mps",
            ClassKind::Timeslice => "timeslice",
            ClassKind::Exclusive => "exclusive",
        }
    }
}

impl fmt::Display for ClassKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one pod asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuClass {
    /// A MIG instance of this profile, e.g. `1g.10gb+me`.
    Mig { profile: String },
    /// One MPS replica of at least `percent` % of a GPU's SMs.
    Mps { percent: u8 },
    /// One time-slicing replica with a declared budget of `percent` % of a GPU.
    Timeslice { percent: u8 },
    /// `count` whole, unshared GPUs.
    Exclusive { count: u32 },
}

impl GpuClass {
    pub fn kind(&self) -> ClassKind {
        match self {
            GpuClass::Mig { .. } => ClassKind::Mig,
            GpuClass::Mps { .. } => ClassKind::Mps,
            GpuClass::Timeslice { .. } => ClassKind::Timeslice,
            GpuClass::Exclusive { .. } => ClassKind::Exclusive,
        }
    }
}

impl fmt::Display for GpuClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuClass::Mig { profile } => write!(f, "mig-{profile}"),
            GpuClass::Mps { percent } => write!(f, "mps-{percent}"),
            GpuClass::Timeslice { percent } => write!(f, "timeslice-{percent}"),
            GpuClass::Exclusive { count: 1 } => write!(f, "exclusive"),
            GpuClass::Exclusive { count } => write!(f, "exclusive-{count}"),
        }
    }
}

/// A full request: the class plus its companions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuRequest {
    pub class: GpuClass,
    /// Memory budget in MiB (mps / timeslice only).
    pub memory_mib: Option<u64>,
    /// MIG instances (1 unless `gpu-share/count` says otherwise; always 1 for other classes).
    pub count: u32,
}

impl GpuRequest {
    pub fn new(class: GpuClass) -> Self {
        GpuRequest {
            class,
            memory_mib: None,
            count: 1,
        }
    }

    /// Its size in thousandths of a GPU ([`RESOURCE_GPU_MILLI`]): a share its percentage, whole
    /// GPUs 1000 each, a MIG device its compute slices of its GPU's (sevenths rounded down, as
    /// the packing counts them, so the seven slices of a GPU never count over one GPU).
    pub fn gpu_milli(&self) -> u32 {
        match &self.class {
            GpuClass::Mps { percent } | GpuClass::Timeslice { percent } => u32::from(*percent) * 10,
            GpuClass::Exclusive { count } => count.saturating_mul(crate::mig::GPU_MILLI),
            GpuClass::Mig { profile } => {
                crate::mig::mig_profile_milli(profile).saturating_mul(self.count.max(1))
            }
        }
    }

    /// The normalized form written to `gpu-share.io/request`.
    pub fn normalized(&self) -> String {
        let mut s = self.class.to_string();
        if let Some(m) = self.memory_mib {
            s.push_str(&format!(",memory={m}Mi"));
        }
        if self.count != 1 {
            s.push_str(&format!(",count={}", self.count));
        }
        s
    }

    /// The share of one GPU for mps/timeslice as a fraction string (`25` -> `0.25`).
    pub fn fraction_of(percent: u8) -> String {
        let s = format!("{:.2}", f64::from(percent) / 100.0);
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    }

    /// Parses the normalized form (`gpu-share.io/request`), with the bounds the `gpu-share`
    /// annotations have: a hand-written value gets no more than a pod's author could ask for.
    pub fn parse_normalized(value: &str) -> Result<GpuRequest, RequestError> {
        let bad = |why: &str| RequestError::Normalized {
            value: value.to_string(),
            why: why.to_string(),
        };
        let mut parts = value.split(',');
        let class = parse_class(parts.next().unwrap_or_default())
            .map_err(|e| bad(&format!("its class is not valid ({e})")))?;
        let mut req = GpuRequest::new(class);
        let mut seen_memory = false;
        let mut seen_count = false;
        for part in parts {
            match part.split_once('=') {
                Some(("memory", v)) => {
                    if seen_memory {
                        return Err(bad("memory is given twice"));
                    }
                    seen_memory = true;
                    if !matches!(req.class, GpuClass::Mps { .. } | GpuClass::Timeslice { .. }) {
                        return Err(bad("memory applies to mps and timeslice only"));
                    }
                    let mib = v
                        .strip_suffix("Mi")
                        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|n| n.parse::<u64>().ok())
                        .ok_or_else(|| bad("memory must be a whole number of Mi, e.g. 12288Mi"))?;
                    if mib == 0 {
                        return Err(bad("memory must be at least 1Mi"));
                    }
                    if mib > MAX_MEMORY_MIB {
                        return Err(bad(&format!("memory must be at most {MAX_MEMORY}")));
                    }
                    req.memory_mib = Some(mib);
                }
                Some(("count", v)) => {
                    if seen_count {
                        return Err(bad("count is given twice"));
                    }
                    seen_count = true;
                    if !matches!(req.class, GpuClass::Mig { .. }) {
                        return Err(bad("count applies to mig only"));
                    }
                    req.count = match v.parse::<u32>() {
                        Ok(n @ 1..=MAX_MIG_COUNT) if v.bytes().all(|b| b.is_ascii_digit()) => n,
                        _ => {
                            return Err(bad(&format!(
                                "count must be a whole number from 1 to {MAX_MIG_COUNT}"
                            )));
                        }
                    };
                }
                _ => {
                    return Err(bad(&format!(
                        "{part:?} is neither memory=<n>Mi nor count=<n>"
                    )));
                }
            }
        }
        Ok(req)
    }
}

/// Why an annotation could not be read. Every message is meant for the pod's author.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("annotation gpu-share is empty; {VALID_FORMS}")]
    Empty,
    #[error("annotation gpu-share value {0:?} is not understood; {VALID_FORMS}")]
    Unparsable(String),
    #[error(
        "annotation gpu-share value {value:?} must be lower-case without spaces ({VALID_FORMS})"
    )]
    NotCanonical { value: String },
    #[error(
        "annotation gpu-share value {value:?}: percent must be a whole number from 1 to 100, got {got}"
    )]
    PercentOutOfRange { value: String, got: String },
    #[error(
        "annotation gpu-share value {value:?}: exclusive GPU count must be from 1 to {MAX_EXCLUSIVE}, got {got}"
    )]
    CountOutOfRange { value: String, got: String },
    #[error(
        "annotation gpu-share/memory value {0:?} is not a Kubernetes quantity such as 12Gi, 12288Mi or 16G"
    )]
    Memory(String),
    #[error("annotation gpu-share/memory must be at least 1Mi, got {0:?}")]
    MemoryZero(String),
    #[error(
        "annotation gpu-share/memory value {0:?} is more than {MAX_MEMORY}, larger than any GPU's memory"
    )]
    MemoryTooLarge(String),
    #[error("annotation {annotation} value {value:?} must be written {canonical:?}")]
    LeadingZero {
        annotation: &'static str,
        value: String,
        canonical: String,
    },
    #[error(
        "annotation gpu-share/memory applies to mps and timeslice only; {class} gets its memory from the {what}"
    )]
    MemoryNotApplicable { class: String, what: &'static str },
    #[error(
        "annotation gpu-share/count value {0:?} must be a whole number from 1 to {MAX_MIG_COUNT}"
    )]
    MigCount(String),
    #[error(
        "annotation gpu-share/count applies to mig only; for {class} use exclusive-<n> for whole GPUs, or one pod per share"
    )]
    CountNotApplicable { class: String },
    #[error("annotation gpu-share/container is empty")]
    EmptyContainer,
    #[error(
        "annotation gpu-share/mig-strategy applies to mig-<profile> only (the form of its MIG device); {class} asks for no MIG device"
    )]
    MigStrategyNotApplicable { class: String },
    #[error(
        "annotation gpu-share/mig-strategy value {0:?} is not a MIG strategy: single (nvidia.com/gpu, the GPU Operator's default) or mixed (nvidia.com/mig-<profile>)"
    )]
    MigStrategy(String),
    #[error(
        "annotation gpu-share.io/request value {value:?} is not a normalized gpu-share request: {why}"
    )]
    Normalized { value: String, why: String },
}

/// Parses the class annotation value.
pub fn parse_class(value: &str) -> Result<GpuClass, RequestError> {
    if value.trim().is_empty() {
        return Err(RequestError::Empty);
    }
    if value != value.trim()
        || value
            .chars()
            .any(|c| c.is_whitespace() || c.is_ascii_uppercase())
    {
        return Err(RequestError::NotCanonical {
            value: value.to_string(),
        });
    }
    let percent = |digits: &str| -> Result<u8, RequestError> {
        let out_of_range = || RequestError::PercentOutOfRange {
            value: value.to_string(),
            got: digits.to_string(),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(if digits.starts_with('-') || digits.contains('.') {
                out_of_range()
            } else {
                RequestError::Unparsable(value.to_string())
            });
        }
        if digits.len() > 1 && digits.starts_with('0') {
            return Err(leading_zero(value, digits));
        }
        match digits.parse::<u32>() {
            Ok(p @ 1..=100) => Ok(p as u8),
            _ => Err(out_of_range()),
        }
    };
    if value == "exclusive" {
        return Ok(GpuClass::Exclusive { count: 1 });
    }
    if let Some(n) = value.strip_prefix("exclusive-") {
        if n.len() > 1 && n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(leading_zero(value, n));
        }
        return match n.parse::<u32>() {
            Ok(count @ 1..=MAX_EXCLUSIVE) if n.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(GpuClass::Exclusive { count })
            }
            _ if n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty() => {
                Err(RequestError::CountOutOfRange {
                    value: value.to_string(),
                    got: n.to_string(),
                })
            }
            _ => Err(RequestError::Unparsable(value.to_string())),
        };
    }
    if let Some(p) = value.strip_prefix("mps-") {
        return percent(p).map(|percent| GpuClass::Mps { percent });
    }
    if let Some(p) = value.strip_prefix("timeslice-") {
        return percent(p).map(|percent| GpuClass::Timeslice { percent });
    }
    // A misspelt profile (`mig-1g.10g`) is still a MIG request: the webhook refuses it against
    // its MIG table, with the nearest names.
    if let Some(profile) = value.strip_prefix("mig-")
        && (is_profile_shaped(profile) || is_profile_like(profile))
    {
        return Ok(GpuClass::Mig {
            profile: profile.to_string(),
        });
    }
    Err(RequestError::Unparsable(value.to_string()))
}

/// The refusal of a number written with leading zeros (`mps-0025` is `mps-25`).
fn leading_zero(value: &str, digits: &str) -> RequestError {
    let trimmed = digits.trim_start_matches('0');
    let number = if trimmed.is_empty() { "0" } else { trimmed };
    RequestError::LeadingZero {
        annotation: ANNOTATION,
        value: value.to_string(),
        canonical: format!("{}{number}", &value[..value.len() - digits.len()]),
    }
}

/// Something a profile was meant to be: a compute part and a memory part that ends in a unit
/// (`1g.10g`, `3g40gb`, `1g.10gb.me`), in lower-case letters, digits, `.` and `+`; not a bare
/// `1g` or a memory size without its unit (`1g.10`).
fn is_profile_like(s: &str) -> bool {
    let base = s.split_once('+').map_or(s, |(b, _)| b);
    (5..=32).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_digit())
        && base.ends_with(['g', 'b'])
        && base[1..].contains('g')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'+')
}

/// `<n>g.<m>gb` with an optional `+<suffix>`; whether the profile exists is the MIG table's call.
fn is_profile_shaped(s: &str) -> bool {
    let (base, suffix) = s.split_once('+').unwrap_or((s, ""));
    if s.contains('+')
        && (suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_lowercase() || b == b'.'))
    {
        return false;
    }
    let Some((g, mem)) = base.split_once("g.") else {
        return false;
    };
    let Some(gb) = mem.strip_suffix("gb") else {
        return false;
    };
    !g.is_empty()
        && g.bytes().all(|b| b.is_ascii_digit())
        && !gb.is_empty()
        && gb.bytes().all(|b| b.is_ascii_digit())
}

/// Parses a Kubernetes quantity into MiB, rounding up. Accepts binary (Ki, Mi, Gi, Ti) and decimal
/// (k, M, G, T) suffixes and plain bytes.
pub fn parse_memory_mib(value: &str) -> Result<u64, RequestError> {
    let err = || RequestError::Memory(value.to_string());
    // Kubernetes quantities take no spaces, and neither does the class annotation.
    let v = value;
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, suffix) = v.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return Err(err());
    }
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(err()),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.len() > 12 || frac.len() > 6 {
        return Err(err());
    }
    let int: u128 = int.parse().map_err(|_| err())?;
    let frac_val: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| err())?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let bytes_scaled = int * scale * multiplier + frac_val * multiplier;
    let mib_den = scale * (1 << 20);
    let mib = bytes_scaled.div_ceil(mib_den);
    if mib == 0 {
        return Err(RequestError::MemoryZero(value.to_string()));
    }
    if mib > MAX_MEMORY_MIB as u128 {
        return Err(RequestError::MemoryTooLarge(value.to_string()));
    }
    u64::try_from(mib).map_err(|_| err())
}

/// The largest `gpu-share/memory` taken: 1 TiB, several times any GPU's memory today.
pub const MAX_MEMORY_MIB: u64 = 1 << 20;
const MAX_MEMORY: &str = "1Ti";

/// What the annotations of a pod ask for, before any policy is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotatedRequest {
    pub request: GpuRequest,
    /// The container named by `gpu-share/container`, if any.
    pub container: Option<String>,
    /// The MIG strategy `gpu-share/mig-strategy` asks for, if any (single or mixed).
    pub mig_strategy: Option<crate::mig::MigStrategy>,
}

/// Reads all `gpu-share` annotations. `Ok(None)` means the pod does not ask for a GPU.
pub fn from_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<AnnotatedRequest>, RequestError> {
    let Some(value) = annotations.get(ANNOTATION) else {
        return Ok(None);
    };
    let class = parse_class(value)?;
    let mut request = GpuRequest::new(class);
    if let Some(m) = annotations.get(ANNOTATION_MEMORY) {
        match &request.class {
            GpuClass::Mps { .. } | GpuClass::Timeslice { .. } => {
                request.memory_mib = Some(parse_memory_mib(m)?)
            }
            GpuClass::Mig { .. } => {
                return Err(RequestError::MemoryNotApplicable {
                    class: request.class.to_string(),
                    what: "MIG profile",
                });
            }
            GpuClass::Exclusive { .. } => {
                return Err(RequestError::MemoryNotApplicable {
                    class: request.class.to_string(),
                    what: "whole GPU",
                });
            }
        }
    }
    if let Some(c) = annotations.get(ANNOTATION_COUNT) {
        if !matches!(request.class, GpuClass::Mig { .. }) {
            return Err(RequestError::CountNotApplicable {
                class: request.class.to_string(),
            });
        }
        request.count = match c.parse::<u32>() {
            Ok(n @ 1..=MAX_MIG_COUNT)
                if c.bytes().all(|b| b.is_ascii_digit()) && !c.starts_with('0') =>
            {
                n
            }
            _ => return Err(RequestError::MigCount(c.clone())),
        };
    }
    let container = match annotations.get(ANNOTATION_CONTAINER) {
        Some(c) if c.trim().is_empty() => return Err(RequestError::EmptyContainer),
        Some(c) => Some(c.clone()),
        None => None,
    };
    let mig_strategy = match annotations.get(ANNOTATION_MIG_STRATEGY) {
        None => None,
        Some(_) if !matches!(request.class, GpuClass::Mig { .. }) => {
            return Err(RequestError::MigStrategyNotApplicable {
                class: request.class.to_string(),
            });
        }
        Some(v) => Some(match v.as_str() {
            "single" => crate::mig::MigStrategy::Single,
            "mixed" => crate::mig::MigStrategy::Mixed,
            _ => return Err(RequestError::MigStrategy(v.clone())),
        }),
    };
    Ok(Some(AnnotatedRequest {
        request,
        container,
        mig_strategy,
    }))
}

#[cfg(test)]
mod tests {

    /// A share is its percentage; whole GPUs a thousand each; a MIG device its compute sevenths
    /// rounded down, so that the seven slices of a GPU never count over one GPU.
    #[test]
    fn every_class_has_its_size_in_thousandths() {
        let of = |text: &str, count: u32| {
            GpuRequest {
                count,
                ..GpuRequest::new(parse_class(text).unwrap())
            }
            .gpu_milli()
        };
        assert_eq!(of("mps-25", 1), 250);
        assert_eq!(of("timeslice-1", 1), 10);
        assert_eq!(of("timeslice-100", 1), 1000);
        assert_eq!(of("exclusive", 1), 1000);
        assert_eq!(of("exclusive-8", 1), 8000);
        let sevenths: Vec<u32> = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
            .iter()
            .map(|p| of(&format!("mig-{p}"), 1))
            .collect();
        assert_eq!(sevenths, [142, 285, 428, 571, 1000]);
        assert!(
            7 * of("mig-1g.10gb", 1) <= 1000 && of("mig-3g.40gb", 1) + of("mig-4g.40gb", 1) <= 1000
        );
        assert_eq!(of("mig-1g.10gb", 3), 426);
    }
    use super::*;

    #[test]
    fn parses_every_class() {
        assert_eq!(
            parse_class("mig-1g.10gb"),
            Ok(GpuClass::Mig {
                profile: "1g.10gb".into()
            })
        );
        assert_eq!(
            parse_class("mig-1g.10gb+me"),
            Ok(GpuClass::Mig {
                profile: "1g.10gb+me".into()
            })
        );
        assert_eq!(
            parse_class("mig-7g.141gb"),
            Ok(GpuClass::Mig {
                profile: "7g.141gb".into()
            })
        );
        assert_eq!(parse_class("mps-25"), Ok(GpuClass::Mps { percent: 25 }));
        assert_eq!(parse_class("mps-100"), Ok(GpuClass::Mps { percent: 100 }));
        assert_eq!(
            parse_class("timeslice-50"),
            Ok(GpuClass::Timeslice { percent: 50 })
        );
        assert_eq!(
            parse_class("exclusive"),
            Ok(GpuClass::Exclusive { count: 1 })
        );
        assert_eq!(
            parse_class("exclusive-2"),
            Ok(GpuClass::Exclusive { count: 2 })
        );
    }

    #[test]
    fn rejects_with_reasons() {
        for bad in [
            "",
            "  ",
            "gpu",
            "mig-",
            "mig-1g",
            "mig-1g.10",
            "mig-xg.10gb",
            "mps",
            "mps-",
            "mps-abc",
            "exclusive-",
            "exclusive-x",
            "timeslice",
        ] {
            let e = parse_class(bad).unwrap_err();
            assert!(
                e.to_string().contains("valid forms") || matches!(e, RequestError::Empty),
                "{bad}: {e}"
            );
        }
        assert!(matches!(
            parse_class("MPS-25"),
            Err(RequestError::NotCanonical { .. })
        ));
        assert!(matches!(
            parse_class("mps-25 "),
            Err(RequestError::NotCanonical { .. })
        ));
        for p in ["0", "101", "1000", "99999999999999999999"] {
            assert!(
                matches!(
                    parse_class(&format!("mps-{p}")),
                    Err(RequestError::PercentOutOfRange { .. })
                ),
                "{p}"
            );
        }
        assert!(matches!(
            parse_class("timeslice-12.5"),
            Err(RequestError::PercentOutOfRange { .. })
        ));
        assert!(matches!(
            parse_class("exclusive-0"),
            Err(RequestError::CountOutOfRange { .. })
        ));
        assert!(matches!(
            parse_class("exclusive-17"),
            Err(RequestError::CountOutOfRange { .. })
        ));
    }

    #[test]
    fn numbers_are_written_one_way() {
        for (value, canonical) in [
            ("mps-00025", "mps-25"),
            ("timeslice-050", "timeslice-50"),
            ("exclusive-02", "exclusive-2"),
        ] {
            let e = parse_class(value).unwrap_err();
            assert_eq!(
                e,
                RequestError::LeadingZero {
                    annotation: ANNOTATION,
                    value: value.into(),
                    canonical: canonical.into()
                }
            );
            assert!(
                e.to_string()
                    .contains(&format!("must be written {canonical:?}")),
                "{e}"
            );
        }
        assert!(parse_class("mps-000").is_err());
        let count = |c: &str| {
            from_annotations(
                &[
                    (ANNOTATION.to_string(), "mig-1g.10gb".to_string()),
                    (ANNOTATION_COUNT.to_string(), c.to_string()),
                ]
                .into(),
            )
        };
        assert!(count("2").is_ok());
        assert!(count("02").is_err());
        // Spaces: refused around a quantity exactly as around a class.
        assert!(parse_class("timeslice-50 ").is_err());
        for spaced in ["12Gi ", " 12Gi", "12Gi\n"] {
            assert!(parse_memory_mib(spaced).is_err(), "{spaced:?}");
        }
    }

    #[test]
    fn memory_is_bounded_by_any_gpu() {
        assert_eq!(parse_memory_mib("1Ti"), Ok(MAX_MEMORY_MIB));
        for big in ["1025Gi", "999999999999Ti", "2T"] {
            let e = parse_memory_mib(big).unwrap_err();
            assert_eq!(e, RequestError::MemoryTooLarge(big.into()));
            assert!(e.to_string().contains("larger than any GPU"), "{e}");
        }
        assert!(GpuRequest::parse_normalized("mps-25,memory=1048577Mi").is_err());
        assert!(GpuRequest::parse_normalized("mps-25,memory=1048576Mi").is_ok());
    }

    #[test]
    fn memory_quantities() {
        assert_eq!(parse_memory_mib("12Gi"), Ok(12 * 1024));
        assert_eq!(parse_memory_mib("12288Mi"), Ok(12288));
        assert_eq!(parse_memory_mib("1.5Gi"), Ok(1536));
        assert_eq!(parse_memory_mib("16G"), Ok(15259)); // 16e9 bytes, rounded up
        assert_eq!(parse_memory_mib("1048576"), Ok(1));
        assert_eq!(parse_memory_mib("1"), Ok(1)); // rounds up
        for bad in [
            "",
            "Gi",
            "12gb",
            "-1Gi",
            "1..5Gi",
            "1e9",
            "12 Gi",
            "99999999999999Ti",
        ] {
            assert!(parse_memory_mib(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            parse_memory_mib("0Mi"),
            Err(RequestError::MemoryZero(_))
        ));
    }

    #[test]
    fn normalized_round_trip() {
        let mut r = GpuRequest::new(GpuClass::Timeslice { percent: 50 });
        r.memory_mib = Some(12288);
        assert_eq!(r.normalized(), "timeslice-50,memory=12288Mi");
        assert_eq!(GpuRequest::parse_normalized(&r.normalized()), Ok(r));
        let mut m = GpuRequest::new(GpuClass::Mig {
            profile: "1g.10gb+me".into(),
        });
        m.count = 2;
        assert_eq!(m.normalized(), "mig-1g.10gb+me,count=2");
        assert_eq!(GpuRequest::parse_normalized(&m.normalized()), Ok(m));
        assert!(GpuRequest::parse_normalized("mps-25,cpu=1").is_err());
        assert_eq!(
            GpuRequest::parse_normalized("mig-1g.10gb,count=56").map(|r| r.count),
            Ok(MAX_MIG_COUNT)
        );
        assert_eq!(GpuRequest::fraction_of(25), "0.25");
        assert_eq!(GpuRequest::fraction_of(50), "0.5");
        assert_eq!(GpuRequest::fraction_of(100), "1");
        assert_eq!(GpuRequest::fraction_of(7), "0.07");
    }

    #[test]
    fn normalized_has_the_annotations_bounds() {
        for (bad, why) in [
            ("exclusive-4000000000", "class is not valid"),
            ("mps-0", "class is not valid"),
            ("timeslice-101", "class is not valid"),
            ("mig-1g.10gb,count=0", "from 1 to 56"),
            ("mig-1g.10gb,count=57", "from 1 to 56"),
            ("mig-1g.10gb,count=4294967295", "from 1 to 56"),
            ("mig-1g.10gb,count=+3", "from 1 to 56"),
            ("mig-1g.10gb,count=2,count=3", "twice"),
            ("mps-25,count=2", "mig only"),
            ("exclusive,count=1", "mig only"),
            ("mps-25,memory=0Mi", "at least 1Mi"),
            ("mps-25,memory=Mi", "whole number of Mi"),
            ("mps-25,memory=+5Mi", "whole number of Mi"),
            ("mps-25,memory=18446744073709551616Mi", "whole number of Mi"),
            ("mps-25,memory=1Mi,memory=2Mi", "twice"),
            ("exclusive,memory=1024Mi", "mps and timeslice only"),
            ("mig-1g.10gb,memory=1024Mi", "mps and timeslice only"),
            ("mps-25,", "neither"),
        ] {
            let e = GpuRequest::parse_normalized(bad).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, RequestError::Normalized { .. }), "{bad}: {e:?}");
            assert!(text.contains(why), "{bad}: {text}");
            assert!(text.contains("gpu-share.io/request"), "{bad}: {text}");
        }
        assert_eq!(
            GpuRequest::parse_normalized("timeslice-1,memory=1Mi").map(|r| r.memory_mib),
            Ok(Some(1))
        );
    }

    #[test]
    fn companions() {
        let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(from_annotations(&ann(&[("other", "x")])), Ok(None));
        let r = from_annotations(&ann(&[
            ("gpu-share", "mps-25"),
            ("gpu-share/memory", "8Gi"),
            ("gpu-share/container", "main"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(r.request.memory_mib, Some(8192));
        assert_eq!(r.container.as_deref(), Some("main"));
        let r = from_annotations(&ann(&[
            ("gpu-share", "mig-1g.10gb"),
            ("gpu-share/count", "3"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(r.request.count, 3);
        assert!(matches!(
            from_annotations(&ann(&[("gpu-share", "mps-25"), ("gpu-share/count", "3")])),
            Err(RequestError::CountNotApplicable { .. })
        ));
        assert!(matches!(
            from_annotations(&ann(&[
                ("gpu-share", "exclusive"),
                ("gpu-share/memory", "3Gi")
            ])),
            Err(RequestError::MemoryNotApplicable { .. })
        ));
        assert!(matches!(
            from_annotations(&ann(&[
                ("gpu-share", "mig-1g.10gb"),
                ("gpu-share/count", "0")
            ])),
            Err(RequestError::MigCount(_))
        ));
        assert!(matches!(
            from_annotations(&ann(&[
                ("gpu-share", "mps-5"),
                ("gpu-share/container", " ")
            ])),
            Err(RequestError::EmptyContainer)
        ));
    }
}
