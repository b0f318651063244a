//! PURE: Kubernetes' version skew policy between the gpu-share-scheduler's kube-scheduler and the
//! cluster's kube-apiserver. kube-scheduler must not be newer than kube-apiserver, and may be at
//! most one minor version older (https://kubernetes.io/releases/version-skew-policy/). A newer one
//! watches APIs the server does not serve, never finishes syncing its caches, and leaves every
//! pod it should schedule Pending with no event; the extender says so instead, in words.

use std::fmt;

/// A Kubernetes major.minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Minor {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for Minor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The version in a git version (`v1.33.5-eks-113cf36`, `v1.37.0`) or in major and minor
/// fields as the API's `/version` gives them (`1`, `33+`).
pub fn parse(version: &str) -> Option<Minor> {
    let v = version.trim().strip_prefix('v').unwrap_or(version.trim());
    let mut parts = v.split('.');
    let number = |s: &str| {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let major = number(parts.next()?)?;
    let minor = number(parts.next()?)?;
    Some(Minor { major, minor })
}

/// The version an image's tag names (`registry.k8s.io/kube-scheduler:v1.33.5`, with or
/// without a digest); `None` for a digest alone or a tag that is no version.
pub fn image_version(image: &str) -> Option<Minor> {
    let name = image.split('@').next()?;
    // A tag follows the last ':' after the last '/' (a registry's port comes before a '/').
    let last = name.rsplit('/').next()?;
    let (_, tag) = last.rsplit_once(':')?;
    tag.starts_with('v').then(|| parse(tag)).flatten()
}

/// What the skew policy says of a kube-scheduler at `scheduler` beside a kube-apiserver at
/// `server`: nothing when it holds, else a sentence that says what to set.
pub fn verdict(
    scheduler: Minor,
    server: Minor,
    image: &str,
    server_version: &str,
) -> Option<String> {
    let fix = format!(
        "set kube-scheduler's image to the cluster's version, registry.k8s.io/kube-scheduler:v{server}.x (Helm sets it from the cluster itself; with kustomize, in your overlay: images: [{{name: registry.k8s.io/kube-scheduler, newTag: v{server}.<patch>}}], docs/install.md)"
    );
    if scheduler.major != server.major || scheduler.minor > server.minor {
        Some(format!(
            "the gpu-share-scheduler's kube-scheduler ({image}) is newer than the cluster's API server ({server_version}): Kubernetes' version skew policy allows a kube-scheduler no newer than the API server, and a newer one waits for APIs the server does not serve, so pods for gpu-share-scheduler stay Pending; {fix}"
        ))
    } else if server.minor - scheduler.minor > 1 {
        Some(format!(
            "the gpu-share-scheduler's kube-scheduler ({image}) is more than one minor version older than the cluster's API server ({server_version}), which Kubernetes' version skew policy does not support; {fix}"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(major: u32, minor: u32) -> Minor {
        Minor { major, minor }
    }

    #[test]
    fn versions_are_read_from_servers_and_image_tags() {
        assert_eq!(parse("v1.33.5-eks-113cf36"), Some(m(1, 33)));
        assert_eq!(parse("1.32+"), Some(m(1, 32)));
        assert_eq!(parse("latest"), None);
        assert_eq!(parse("v1.30.14-gke.1000"), Some(m(1, 30)));
        assert_eq!(
            image_version("registry.k8s.io/kube-scheduler:v1.37.0"),
            Some(m(1, 37))
        );
        assert_eq!(
            image_version("my.registry:5000/k8s/kube-scheduler:v1.33.5@sha256:abcd"),
            Some(m(1, 33))
        );
        assert_eq!(image_version("my.registry:5000/kube-scheduler"), None);
        assert_eq!(
            image_version("registry.k8s.io/kube-scheduler@sha256:abcd"),
            None
        );
        assert_eq!(image_version("kube-scheduler:latest"), None);
    }

    #[test]
    fn a_newer_or_much_older_scheduler_is_said_in_words() {
        let image = "registry.k8s.io/kube-scheduler:v1.37.0";
        let newer = verdict(m(1, 37), m(1, 33), image, "v1.33.5-eks-113cf36").unwrap();
        assert!(newer.contains("newer than the cluster's API server (v1.33.5-eks-113cf36)"));
        assert!(
            newer.contains("registry.k8s.io/kube-scheduler:v1.33.x"),
            "{newer}"
        );
        assert!(newer.contains("newTag: v1.33.<patch>"), "{newer}");
        assert_eq!(verdict(m(1, 33), m(1, 33), image, "v1.33.5"), None);
        assert_eq!(verdict(m(1, 32), m(1, 33), image, "v1.33.5"), None);
        let old = verdict(m(1, 30), m(1, 33), image, "v1.33.5").unwrap();
        assert!(old.contains("more than one minor version older"), "{old}");
        assert!(verdict(m(2, 0), m(1, 33), image, "v1.33.5").is_some());
    }
}
