//! The report's first screen: the four questions a student brings to the article, each answered
//! by the experiment that measures it. An experiment's `render` writes its [`Answer`] (and the
//! [`KeyNumber`]s behind the article's claims it decides) onto the experiment's canvas;
//! `report` puts the short answers on the first screen and each question's screen after it.

use serde::Serialize;

/// The four questions, in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Question {
    /// Does the dot product's std grow as √d_k?
    DotStd,
    /// Does softmax saturate without the scale, and at what logit std?
    Saturation,
    /// Do gradients vanish: which gradient shrinks, which grows?
    Gradients,
    /// Does training suffer, and under which initialization?
    Training,
}

impl Question {
    /// Every question, in order.
    pub const ALL: [Question; 4] = [
        Question::DotStd,
        Question::Saturation,
        Question::Gradients,
        Question::Training,
    ];

    /// The question as the reader asks it.
    pub fn text(self) -> &'static str {
        match self {
            Question::DotStd => "Does q·k's spread grow like √d_k?",
            Question::Saturation => "Without the scale, does softmax saturate?",
            Question::Gradients => "Do the gradients vanish?",
            Question::Training => "Does training suffer?",
        }
    }

    /// Its screen's heading (also its anchor, lower-cased with dashes).
    pub fn heading(self) -> &'static str {
        match self {
            Question::DotStd => "1. The dot product grows like √d_k",
            Question::Saturation => "2. Softmax saturates, but less than the article says",
            Question::Gradients => "3. Gradients: one shrinks, the others grow",
            Question::Training => "4. Training without the scale",
        }
    }

    /// The heading's anchor as GitHub renders it.
    pub fn anchor(self) -> String {
        crate::markdown::anchor(self.heading())
    }
}

/// One experiment's answer to a question.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// Which question.
    pub question: Question,
    /// The first screen's answer in plain words, with one number and its interval (`None`: the
    /// experiment only adds to the question's screen).
    pub short: Option<String>,
    /// Its part of the question's screen (Markdown): the setup in two sentences, one figure, the
    /// effect size with its interval, the caveat.
    pub screen: String,
    /// From a confirmatory run: where one answered, the first screen quotes it alone.
    pub confirmatory: bool,
}

/// The number that decides one of the article's claims, short enough for the first screen's
/// table (e.g. `0.499 [0.497, 0.501]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyNumber {
    /// The claim's id.
    pub claim_id: String,
    /// The number with its interval and what it is.
    pub number: String,
}

/// Words in `text` as the report counts them: whitespace-separated tokens, leaving out table
/// rows and image lines.
pub fn words(text: &str) -> usize {
    text.lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with('|') && !l.starts_with("![")
        })
        .map(|l| l.split_whitespace().count())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_leave_out_tables_and_images() {
        let text = "# Title here\n\nOne two three.\n| a | b |\n|---|---|\n![x](x.png)\n- four five";
        // `#` and `-` are tokens too: 3 + 3 + 3.
        assert_eq!(words(text), 9);
    }

    #[test]
    fn anchors_follow_github() {
        assert_eq!(
            Question::DotStd.anchor(),
            "1-the-dot-product-grows-like-d_k"
        );
    }
}
