//! A bind's calls to the API and their answers: what [`super::decision`] asks and
//! settles by, and what an [`crate::extender::Executor`] carries out and hands back.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::error::{BindCallError, ReadBackError};
use crate::cluster::reservation_api::CreateError;
use crate::reservation::Template;

/// One bind's calls to the API, in their order: the reservation its share needs first, if any,
/// then the binding of pod `uid` to `node`, which writes `annotations` onto it.
#[derive(Debug, Clone)]
pub struct BindCalls {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub annotations: BTreeMap<String, String>,
    pub reservation: Option<ReservationCall>,
}

/// A reservation to create on the bind's node: GPU `gpu`'s, running its MPS daemon when `mps`.
#[derive(Debug, Clone)]
pub struct ReservationCall {
    pub gpu: u32,
    pub mps: bool,
    pub template: Template,
}

/// How the API answered a bind's calls.
#[derive(Debug)]
pub enum BindAnswers {
    /// GPU `gpu`'s reservation was not created: the binding was not tried.
    NotCreated { gpu: u32, error: CreateError },
    /// The binding was tried, after the reservation's create where one was asked (`created`:
    /// the pod as created, `None` where it existed).
    Tried {
        created: Option<Box<Option<Pod>>>,
        ended: Ended,
    },
}

/// How the binding call ended.
#[derive(Debug)]
pub enum Ended {
    /// The API bound the pod (in `--dev`, there is no API to ask).
    Bound,
    /// The call failed; for an outcome it leaves unknown ([`read_back_needed`]), where reading
    /// the pod back found it (`Ok(node)`, `None` for unbound, gone or replaced) or why not.
    Failed {
        why: BindCallError,
        read: Option<Result<Option<String>, ReadBackError>>,
    },
}

/// Whether a failed binding call leaves its outcome unknown: a server error, a lost connection,
/// no answer, or a conflict (409: already bound, perhaps by this very binding's earlier try);
/// the pod is then read back rather than guessed about, since releasing a binding that took
/// would free capacity a running pod holds. A refusal (any other 4xx) bound nothing.
pub fn read_back_needed(why: &BindCallError) -> bool {
    match why {
        BindCallError::Api(kube::Error::Api(s)) if s.code == 409 => true,
        BindCallError::Api(kube::Error::Api(s)) => !(400..500).contains(&s.code),
        BindCallError::Api(_) | BindCallError::Unanswered => true,
    }
}
