//! The kinds of check the suite runs.

use serde::Serialize;

/// The three kinds of check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    Forward,
    Backward,
    Gradcheck,
}

impl Check {
    pub const ALL: [Check; 3] = [Check::Forward, Check::Backward, Check::Gradcheck];

    pub fn name(self) -> &'static str {
        match self {
            Check::Forward => "forward",
            Check::Backward => "backward",
            Check::Gradcheck => "gradcheck",
        }
    }
}
