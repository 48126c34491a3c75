//! Error chains as one line: the error and each of its sources, joined by `": "`, as Go's wrapped
//! errors read in KubeVirt's messages and logs.

/// `error` and its sources joined by `": "` (`"outer step failed: disk full"`).
pub fn error_chain(error: &(dyn std::error::Error + '_)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer step failed")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn sources_are_joined_in_order() {
        let cases: [(&dyn std::error::Error, &str); 2] = [
            (&std::io::Error::other("alone"), "alone"),
            (
                &Outer(Middle(std::io::Error::other("disk full"))),
                "outer step failed: middle: disk full",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(error_chain(e), want);
        }
    }
}
