//! Kubernetes quantities and MIG resource suffixes, as node objects write them.

/// `1g.10gb.me` (resource form) -> `1g.10gb+me` (profile form).
pub fn profile_from_resource_suffix(suffix: &str) -> String {
    match suffix.find("gb.") {
        Some(i) => format!("{}+{}", &suffix[..i + 2], &suffix[i + 3..]),
        None => suffix.to_string(),
    }
}

/// Parses a Kubernetes quantity to thousandths of a unit (`"2"` -> 2000, `"1500m"` -> 1500,
/// `"16Gi"` -> 16*2^30*1000). `None` when it is not a quantity.
pub fn quantity_milli(value: &str) -> Option<u128> {
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, suffix) = v.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 {
        return None;
    }
    let (mul_num, mul_den): (u128, u128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "k" => (1_000_000, 1),
        "M" => (1_000_000_000, 1),
        "G" => (1_000_000_000_000, 1),
        "T" => (1_000_000_000_000_000, 1),
        "Ki" => (1000 << 10, 1),
        "Mi" => (1000 << 20, 1),
        "Gi" => (1000 << 30, 1),
        "Ti" => (1000 << 40, 1),
        _ => return None,
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.len() > 18 || frac.len() > 9 {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_val: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = int.checked_mul(scale)?.checked_add(frac_val)?;
    Some(scaled.checked_mul(mul_num)? / (scale * mul_den))
}

/// A quantity as a whole count (extended resources are integers); `None` if not a quantity.
pub fn quantity_count(value: &str) -> Option<u64> {
    quantity_milli(value).map(|m| u64::try_from(m / 1000).unwrap_or(u64::MAX))
}
