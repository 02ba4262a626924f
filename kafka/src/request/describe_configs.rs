//! The DescribeConfigs request (key 32), versions 1–4: an admin client asks for the configs of
//! resources (topics, brokers), all of them or named keys.

use crate::error::DecodeError;
use crate::read::Reader;

/// Resources one DescribeConfigs request may ask about.
pub const DESCRIBE_CONFIGS_RESOURCES_MAX: usize = 10_000;
/// Config keys one resource may name.
pub const DESCRIBE_CONFIGS_KEYS_MAX: usize = 1_000;

/// `resource_type` of a topic.
pub const TOPIC_RESOURCE_TYPE: i8 = 2;
/// `resource_type` of a broker (its name the broker id in decimal, or empty for the cluster
/// default).
pub const BROKER_RESOURCE_TYPE: i8 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsRequest {
    pub resources: Vec<DescribeConfigsResource>,
    /// v1+: whether to list each config's synonyms; `false` before v1.
    pub include_synonyms: bool,
    /// v3+: whether to include each config's documentation; `false` before v3.
    pub include_documentation: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsResource {
    /// [`TOPIC_RESOURCE_TYPE`], [`BROKER_RESOURCE_TYPE`] or another type, kept as sent for the
    /// handler to refuse.
    pub resource_type: i8,
    pub resource_name: String,
    /// `None`: every config of the resource.
    pub configuration_keys: Option<Vec<String>>,
}

impl DescribeConfigsRequest {
    pub fn decode(
        reader: &mut Reader,
        version: i16,
    ) -> Result<DescribeConfigsRequest, DecodeError> {
        let flexible = version >= 4;
        // A resource is at least its type, a name length, a key count and (flexible) its tagged
        // fields.
        let count = reader.array_len(
            "describe configs resources",
            flexible,
            4,
            DESCRIBE_CONFIGS_RESOURCES_MAX,
        )?;
        let mut resources = Vec::with_capacity(count);
        for _ in 0..count {
            let resource_type = reader.i8("resource type")?;
            let resource_name = reader.string("resource name", flexible)?;
            let count = reader.nullable_array_len(
                "describe configs keys",
                flexible,
                1,
                DESCRIBE_CONFIGS_KEYS_MAX,
            )?;
            let configuration_keys = match count {
                None => None,
                Some(count) => {
                    let mut keys = Vec::with_capacity(count);
                    for _ in 0..count {
                        keys.push(reader.string("configuration key", flexible)?);
                    }
                    Some(keys)
                }
            };
            reader.skip_tagged_fields(flexible)?;
            resources.push(DescribeConfigsResource {
                resource_type,
                resource_name,
                configuration_keys,
            });
        }
        let include_synonyms = if version >= 1 { reader.bool("include synonyms")? } else { false };
        let include_documentation =
            if version >= 3 { reader.bool("include documentation")? } else { false };
        reader.skip_tagged_fields(flexible)?;
        Ok(DescribeConfigsRequest { resources, include_synonyms, include_documentation })
    }
}
