//! Text in and out of `generate`: a Hugging Face `tokenizer.json` through the `tokenizers`
//! crate (pure Rust: the fancy-regex backend, nothing downloaded).

use std::path::Path;

use crate::Error;

/// A tokenizer read from a `tokenizer.json` file.
pub struct Text {
    tok: tokenizers::Tokenizer,
    path: String,
}

impl Text {
    /// Reads `path`; errors name the file and what was expected.
    pub fn load(path: &Path) -> Result<Text, Error> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Generate(format!("tokenizer file {shown}: cannot read it: {e}")))?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            Error::Generate(format!("tokenizer file {shown}: expected a Hugging Face tokenizer.json: {e}"))
        })?;
        Ok(Text { tok, path: shown })
    }

    /// The token ids of `text` (with the tokenizer's special tokens, as the model was trained).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, Error> {
        let enc = self
            .tok
            .encode(text, true)
            .map_err(|e| Error::Generate(format!("tokenizer {}: cannot encode {text:?}: {e}", self.path)))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// The text of `ids` (special tokens skipped); ids the tokenizer does not know are
    /// dropped by it.
    pub fn decode(&self, ids: &[i64]) -> Result<String, Error> {
        let ids: Vec<u32> = ids.iter().map(|&i| u32::try_from(i).unwrap_or(u32::MAX)).collect();
        self.tok
            .decode(&ids, true)
            .map_err(|e| Error::Generate(format!("tokenizer {}: cannot decode {ids:?}: {e}", self.path)))
    }
}
