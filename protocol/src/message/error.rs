//! Why a request is refused: [`RequestError`], [`LayoutError`] and [`Detail`].

use super::consts::{LIMITS_MAX, TIER_BYTES_MAX};
use crate::limit::Kind;
use crate::policy::PolicyError;
use crate::status::Status;

/// Why a payload does not have its op's layout (BAD_REQUEST), for the
/// error text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("payload length does not match its fields")]
    Length,
    #[error("reserved bytes must be 0")]
    Reserved,
    #[error("mode {0} is not one of 0 (spend), 1 (probe), 2 (refund), 3 (reset)")]
    Mode(u8),
    #[error("reset takes cost 0")]
    ResetCost,
    #[error("name a tier or send 1..={LIMITS_MAX} inline limits")]
    NoLimits,
    #[error("at most {LIMITS_MAX} inline limits")]
    LimitCount,
    #[error("name a tier or send inline limits, not both")]
    TierAndLimits,
    #[error("a tier name is 1..={TIER_BYTES_MAX} bytes of UTF-8")]
    TierName,
    #[error("limit kind {0} is not one of 1..=5")]
    Kind(u8),
    #[error("field c of a {0} limit must be 0")]
    UnusedField(Kind),
    #[error("leases belong to concurrency limits, not to {0}")]
    NotConcurrency(Kind),
    #[error("limit_index must name one of the request's or tier's limits")]
    LimitIndex,
    #[error("lease id 0 names no lease")]
    LeaseIdZero,
}

/// What exactly was wrong with a request, beyond its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// A limit's numbers or the cost (INVALID_POLICY, COST_EXCEEDS_BURST).
    Policy(PolicyError),
    /// The payload's layout (BAD_REQUEST).
    Layout(LayoutError),
}

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Detail::Policy(e) => e.fmt(f),
            Detail::Layout(e) => e.fmt(f),
        }
    }
}

/// Why a message is not a valid request: the status to answer it with,
/// and a detail for the human text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// The wire status.
    pub status: Status,
    /// What exactly was wrong, if more than the status says.
    pub detail: Option<Detail>,
    /// The position of the limit the error is about (inline or in the
    /// tier), when it is about one.
    pub limit_index: Option<u8>,
}

impl RequestError {
    /// The same error, about the limit at `index`.
    #[inline]
    pub fn at(self, index: usize) -> RequestError {
        RequestError {
            limit_index: u8::try_from(index).ok(),
            ..self
        }
    }
}

impl From<Status> for RequestError {
    fn from(status: Status) -> Self {
        RequestError {
            status,
            detail: None,
            limit_index: None,
        }
    }
}

impl From<PolicyError> for RequestError {
    fn from(e: PolicyError) -> Self {
        let status = match e {
            PolicyError::CostExceedsBurst { .. } | PolicyError::CostExceedsLimit { .. } => {
                Status::CostExceedsBurst
            }
            _ => Status::InvalidPolicy,
        };
        RequestError {
            status,
            detail: Some(Detail::Policy(e)),
            limit_index: None,
        }
    }
}

impl From<LayoutError> for RequestError {
    fn from(e: LayoutError) -> Self {
        RequestError {
            status: Status::BadRequest,
            detail: Some(Detail::Layout(e)),
            limit_index: None,
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.status.text())?;
        if let Some(i) = self.limit_index {
            write!(f, ": limit {i}")?;
        }
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}
