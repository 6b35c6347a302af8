pub mod bench;
pub mod inspect;
pub mod logits;
pub mod perplexity;
pub mod quantize;
pub mod run;
pub mod synth;
pub mod tensor;
