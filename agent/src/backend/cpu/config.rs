//! The encoder's `config.json`, in either of the two styles transformers writes.
//!
//! transformers 5 stores the attention pattern as `layer_types` and RoPE as `rope_parameters`
//! per layer type; transformers 4 stores `global_attn_every_n_layers`, `global_rope_theta` and
//! `local_rope_theta`. Both describe the same model and both load here (transformers 5 itself
//! reads both). Keys transformers would default are defaulted the same way.

use std::path::Path;

use laya_topics::Value;

use super::ModelError;
use crate::bundle::read_json;

/// How a layer attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Every token sees every (non-padding) token.
    Global,
    /// A token sees tokens within `local_attention / 2` positions.
    Sliding,
}

/// The MLP activation (`hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact (erf) GELU.
    Gelu,
    /// `gelu_pytorch_tanh` / `gelu_new`: the tanh approximation.
    GeluTanh,
    Relu,
    Silu,
}

/// ModernBERT hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_activation: Activation,
    pub norm_eps: f64,
    pub norm_bias: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// The full sliding window; a token sees `local_attention / 2` on each side.
    pub local_attention: usize,
    pub layer_types: Vec<LayerType>,
    pub global_rope_theta: f64,
    pub local_rope_theta: f64,
}

impl EncoderConfig {
    /// Half the sliding window: the largest |i - j| a sliding layer attends over.
    pub fn sliding_window(&self) -> usize {
        self.local_attention / 2
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Reads `encoder/config.json`.
    pub fn load(path: &Path) -> Result<EncoderConfig, ModelError> {
        let v = read_json(path)?;
        Self::from_value(&v).map_err(|message| ModelError::Config { path: path.to_owned(), message })
    }

    /// Interprets a parsed config.
    pub fn from_value(v: &Value) -> Result<EncoderConfig, String> {
        if let Some(t) = v.get("model_type").and_then(Value::as_str)
            && t != "modernbert"
        {
            return Err(format!("model_type {t:?} is not supported (only modernbert)"));
        }
        let uint = |key: &str, default: Option<usize>| -> Result<usize, String> {
            match v.get(key) {
                Some(x) => x
                    .as_i64()
                    .and_then(|i| usize::try_from(i).ok())
                    .ok_or_else(|| format!("'{key}' must be a non-negative integer")),
                None => default.ok_or_else(|| format!("'{key}' is missing")),
            }
        };
        let float = |key: &str| -> Option<f64> {
            match v.get(key)? {
                Value::Float(f) => Some(*f),
                Value::Int(i) => Some(i.to_f64()),
                _ => None,
            }
        };
        let flag = |key: &str, default: bool| match v.get(key) {
            Some(Value::Bool(b)) => *b,
            _ => default,
        };
        let hidden_size = uint("hidden_size", Some(768))?;
        let num_hidden_layers = uint("num_hidden_layers", Some(22))?;
        let num_attention_heads = uint("num_attention_heads", Some(12))?;
        // A width of zero would leave every layer without features (and the blocks of the
        // feed-forward and of attention without a row to step by): refused by name.
        let intermediate_size = uint("intermediate_size", Some(1152))?;
        for (key, value) in [("hidden_size", hidden_size), ("intermediate_size", intermediate_size)] {
            if value == 0 {
                return Err(format!("{key} must be positive"));
            }
        }
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            return Err(format!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}"
            ));
        }
        if (hidden_size / num_attention_heads) % 2 != 0 {
            return Err("the head dimension must be even for rotary embeddings".into());
        }
        let hidden_activation = match v.get("hidden_activation").and_then(Value::as_str).unwrap_or("gelu") {
            "gelu" => Activation::Gelu,
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            other => return Err(format!("hidden_activation {other:?} is not supported")),
        };
        let layer_types = match v.get("layer_types") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(LayerType::Global),
                    Some("sliding_attention") => Ok(LayerType::Sliding),
                    _ => Err(format!("unknown layer type {t:?}")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                let every = uint("global_attn_every_n_layers", Some(3))?.max(1);
                (0..num_hidden_layers)
                    .map(|i| if i % every == 0 { LayerType::Global } else { LayerType::Sliding })
                    .collect()
            }
        };
        if layer_types.len() != num_hidden_layers {
            return Err(format!("layer_types has {} entries for {num_hidden_layers} layers", layer_types.len()));
        }
        // rope_parameters (transformers 5) first, then the flat 4.x keys, then the defaults.
        let rope_theta = |layer_type: &str, flat_key: &str, default: f64| -> Result<f64, String> {
            if let Some(params) = v.get("rope_parameters") {
                let p = params.get(layer_type).unwrap_or(params);
                if let Some(kind) = p.get("rope_type").and_then(Value::as_str)
                    && kind != "default"
                {
                    return Err(format!("rope_type {kind:?} is not supported"));
                }
                match p.get("rope_theta") {
                    Some(Value::Float(f)) => return Ok(*f),
                    Some(Value::Int(i)) => return Ok(i.to_f64()),
                    _ => {}
                }
            }
            Ok(float(flat_key).unwrap_or(default))
        };
        Ok(EncoderConfig {
            vocab_size: uint("vocab_size", Some(50368))?,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            intermediate_size,
            hidden_activation,
            norm_eps: float("norm_eps").or_else(|| float("layer_norm_eps")).unwrap_or(1e-5),
            norm_bias: flag("norm_bias", false),
            attention_bias: flag("attention_bias", false),
            mlp_bias: flag("mlp_bias", false),
            local_attention: uint("local_attention", Some(128))?,
            layer_types,
            global_rope_theta: rope_theta("full_attention", "global_rope_theta", 160_000.0)?,
            local_rope_theta: rope_theta("sliding_attention", "local_rope_theta", 10_000.0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya_topics::json::{ParseOptions, parse_str};

    fn cfg(s: &str) -> Result<EncoderConfig, String> {
        EncoderConfig::from_value(&parse_str(s, ParseOptions::default()).unwrap())
    }

    #[test]
    fn transformers_4_and_5_styles_describe_the_same_model() {
        let v5 = cfg(r#"{"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"], "rope_parameters": {"full_attention": {"rope_theta": 4000.0, "rope_type": "default"}, "sliding_attention": {"rope_theta": 50.0, "rope_type": "default"}}}"#).unwrap();
        let v4 = cfg(r#"{"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "global_attn_every_n_layers": 3, "global_rope_theta": 4000.0, "local_rope_theta": 50}"#).unwrap();
        assert_eq!(v5, v4);
        assert_eq!(v4.layer_types, [LayerType::Global, LayerType::Sliding, LayerType::Sliding, LayerType::Global]);
    }

    #[test]
    fn unsupported_configs_are_named() {
        assert!(cfg(r#"{"model_type": "bert"}"#).unwrap_err().contains("bert"));
        assert!(cfg(r#"{"hidden_size": 65, "num_attention_heads": 4}"#).is_err());
        assert!(
            cfg(r#"{"hidden_size": 0, "num_attention_heads": 4}"#)
                .unwrap_err()
                .contains("hidden_size must be positive")
        );
        assert!(cfg(r#"{"intermediate_size": 0}"#).unwrap_err().contains("intermediate_size must be positive"));
        assert!(cfg(r#"{"hidden_activation": "mish"}"#).unwrap_err().contains("mish"));
        assert!(cfg(r#"{"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}"#).is_err());
    }
}
