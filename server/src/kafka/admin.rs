//! Kafka's admin APIs on Shoal's catalog: CreateTopics and DeleteTopics become the metadata
//! commands `shoalctl topic create` and `delete` propose, CreatePartitions grows a topic, DescribeConfigs reads a topic's
//! settings under Kafka's config names, DescribeCluster names the nodes, and DescribeGroups and
//! ListGroups ask the Kafka group coordinator.
//!
//! Topic configs are Shoal's settings under Kafka's names ([`TOPIC_CONFIGS`]); anything else —
//! `cleanup.policy=compact` above all, since Shoal does not compact — is INVALID_CONFIG, never
//! silently ignored. Every node holds every partition, so the replication factor is the node
//! count (−1 asks for it); another is INVALID_REPLICATION_FACTOR, and manual replica
//! assignments are INVALID_REPLICA_ASSIGNMENT.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use shoal_kafka::kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use shoal_kafka::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use shoal_kafka::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use shoal_kafka::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use shoal_kafka::kafka_protocol::messages::describe_groups_response::{
    DescribedGroup, DescribedGroupMember,
};
use shoal_kafka::kafka_protocol::messages::list_groups_response::ListedGroup;
use shoal_kafka::kafka_protocol::messages::{
    BrokerId, CreatePartitionsResponse, CreateTopicsResponse, DeleteTopicsResponse,
    DescribeClusterResponse, DescribeConfigsResponse, DescribeGroupsResponse, GroupId,
    ListGroupsResponse, TopicName,
};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::{
    BROKER_RESOURCE_TYPE, CreatePartitionsRequest, CreatePartitionsTopic, CreateTopicsRequest,
    DeleteTopicsRequest, DescribeConfigsRequest, DescribeGroupsRequest, ListGroupsRequest,
    MetadataRequest, TOPIC_RESOURCE_TYPE,
};
use shoal_proto::Durability;
use shoal_proto::protocol::{CreateTopic, ErrorCode, Operation};

use super::Connection;
use super::errors::kafka_error;
use crate::kafka_groups::GroupState;
use crate::metadata::{MetaCommand, TopicSettings};
use crate::shard::{KafkaGroupReply, KafkaGroupRequest, Outcome, Work};

/// Config sources: set for the topic, or the server's default.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;
/// DescribeCluster's "authorized operations not asked for".
const OPERATIONS_NOT_ASKED: i32 = i32::MIN;

/// The topic configs Shoal knows, by Kafka's names: each a setting of `TopicSettings`.
pub const TOPIC_CONFIGS: &[&str] = &[
    "cleanup.policy",
    "compression.type",
    "max.message.bytes",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "shoal.durability",
];

/// A topic's configs under Kafka's names, in [`TOPIC_CONFIGS`] order. Kafka's "unbounded" is
/// −1 where Shoal's is 0.
fn topic_configs(settings: &TopicSettings) -> Vec<(&'static str, String)> {
    let unbounded = |value: u64| if value == 0 { "-1".to_string() } else { value.to_string() };
    vec![
        ("cleanup.policy", "delete".into()),
        ("compression.type", "producer".into()),
        ("max.message.bytes", settings.message_size_bytes_max.to_string()),
        ("retention.bytes", unbounded(settings.retention_bytes)),
        ("retention.ms", unbounded(settings.retention_ms)),
        ("segment.bytes", settings.segment_size_bytes.to_string()),
        ("shoal.durability", settings.durability.to_string()),
    ]
}

/// Reads Kafka topic configs into a create request; the error names the config.
fn apply_config(create: &mut CreateTopic, name: &str, value: Option<&str>) -> Result<(), String> {
    let value = value.ok_or_else(|| format!("{name}: a value is required"))?;
    let number = || value.parse::<i64>().map_err(|_| format!("{name}={value}: not a number"));
    // Kafka's −1 is "unbounded", Shoal's 0.
    let bound = || -> Result<u64, String> {
        match number()? {
            -1 => Ok(0),
            n if n > 0 => Ok(n as u64),
            _ => Err(format!("{name}={value}: use a positive number or -1")),
        }
    };
    let positive = || -> Result<u64, String> {
        match number()? {
            n if n > 0 => Ok(n as u64),
            _ => Err(format!("{name}={value}: use a positive number")),
        }
    };
    match name {
        "cleanup.policy" if value == "delete" => {}
        "cleanup.policy" => {
            return Err(format!(
                "cleanup.policy={value}: Shoal deletes old segments, never compacts"
            ));
        }
        "compression.type" if value == "producer" => {}
        "compression.type" => {
            return Err(format!(
                "compression.type={value}: batches are stored as their producer compressed them \
                 (\"producer\")"
            ));
        }
        "max.message.bytes" => create.message_size_bytes_max = Some(positive()?),
        "retention.bytes" => create.retention_bytes = Some(bound()?),
        "retention.ms" => create.retention_ms = Some(bound()?),
        "segment.bytes" => create.segment_size_bytes = Some(positive()?),
        "shoal.durability" => {
            let durability: Durability = value
                .parse()
                .map_err(|_| format!("{name}={value}: use replicated or persisted"))?;
            create.durability = Some(durability);
        }
        _ => {
            return Err(format!(
                "{name} is not a topic config Shoal has (it has: {})",
                TOPIC_CONFIGS.join(", ")
            ));
        }
    }
    Ok(())
}

/// The CreateTopics response: each topic checked and, unless `validate_only`, created in turn.
pub(super) async fn create_topics(
    connection: &mut Connection,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.clone();
        let result = match connection.create_topic(topic, request.validate_only).await {
            Ok(settings) => {
                connection.context.published.refresh(&mut connection.catalog);
                let id = connection
                    .find_topic(Some(&name), &[0; 16])
                    .map_or([0; 16], |(_, topic)| connection.topic_id(topic));
                let configs = topic_configs(&settings)
                    .into_iter()
                    .map(|(name, value)| {
                        CreatableTopicConfigs::default()
                            .with_name(StrBytes::from_static_str(name))
                            .with_value(Some(StrBytes::from_string(value)))
                            .with_config_source(SOURCE_TOPIC)
                    })
                    .collect();
                CreatableTopicResult::default()
                    .with_topic_id(shoal_kafka::Uuid::from_bytes(id))
                    .with_num_partitions(settings.partitions as i32)
                    .with_replication_factor(i16::from(settings.replication_factor))
                    .with_configs(Some(configs))
            }
            Err((error, message)) => CreatableTopicResult::default()
                .with_error_code(error.code())
                .with_error_message(Some(StrBytes::from_string(message)))
                .with_num_partitions(-1)
                .with_replication_factor(-1),
        };
        results.push(result.with_name(TopicName(StrBytes::from_string(name))));
    }
    CreateTopicsResponse::default().with_topics(results)
}

impl Connection {
    /// Checks one topic of a CreateTopics and, unless `validate_only`, proposes it.
    async fn create_topic(
        &mut self,
        topic: shoal_kafka::request::CreateTopic,
        validate_only: bool,
    ) -> Result<TopicSettings, (ResponseError, String)> {
        let config = &self.context.config;
        let nodes = self.catalog.active_node_count(&config.cluster);
        let replication_factor = match topic.replication_factor {
            -1 => None,
            factor if (1..=i16::from(nodes)).contains(&factor) => Some(factor as u8),
            factor => {
                return Err((
                    ResponseError::InvalidReplicationFactor,
                    format!("replication factor {factor}: use 1 to {nodes}, or -1 for the default"),
                ));
            }
        };
        if !topic.assignments.is_empty() {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                "replicas are not assigned by hand: placement spreads them over the nodes".into(),
            ));
        }
        let partitions = match topic.num_partitions {
            -1 => 0,
            n if n > 0 => n as u32,
            n => {
                return Err((
                    ResponseError::InvalidPartitions,
                    format!("{n} partitions: use a positive number, or -1 for the default"),
                ));
            }
        };
        let mut create = CreateTopic {
            stream: config.kafka.stream.clone(),
            topic: topic.name.clone(),
            partitions,
            durability: None,
            retention_bytes: None,
            retention_ms: None,
            segment_size_bytes: None,
            message_size_bytes_max: None,
            replica_lag_time_max_ms: None,
            replication_factor,
        };
        for config in &topic.configs {
            apply_config(&mut create, &config.name, config.value.as_deref())
                .map_err(|message| (ResponseError::InvalidConfig, message))?;
        }
        shoal_proto::protocol::validate_name(&topic.name)
            .map_err(|reason| (ResponseError::InvalidTopicException, reason.to_string()))?;
        let record_max = config.shard.iter().map(|s| s.storage.record_size_bytes_max).min();
        let settings = TopicSettings::resolve(
            &create,
            &config.topic_defaults,
            record_max.unwrap_or(0),
            config.metadata.topic_partitions_max,
            nodes,
        )
        .map_err(|(_, message)| {
            let error = if message.starts_with("partitions") {
                ResponseError::InvalidPartitions
            } else {
                ResponseError::InvalidConfig
            };
            (error, message)
        })?;
        if self.find_topic(Some(&topic.name), &[0; 16]).is_ok() {
            return Err((ResponseError::TopicAlreadyExists, format!("{} exists", topic.name)));
        }
        if validate_only {
            return Ok(settings);
        }
        let stream = create.stream.clone();
        if !self.catalog.streams.contains_key(&stream) {
            // The Kafka stream comes with its first topic; another creator may win the race.
            match self
                .propose(
                    Operation::CreateStream,
                    MetaCommand::CreateStream { name: stream.clone() },
                )
                .await
            {
                Ok(()) | Err((ErrorCode::StreamExists, _)) => {}
                Err(refused) => return Err(admin_error(refused)),
            }
        }
        let command = MetaCommand::CreateTopic { stream, topic: topic.name, settings, nodes };
        self.propose(Operation::CreateTopic, command).await.map_err(admin_error)?;
        Ok(settings)
    }

    /// Proposes a metadata command under this connection's client id; done once committed.
    async fn propose(
        &mut self,
        operation: Operation,
        command: MetaCommand,
    ) -> Result<(), (ErrorCode, String)> {
        let client = self.next_request(operation);
        let (reply, answer) = flume::bounded(1);
        self.send(0, Work::Metadata { client, command, reply })
            .await
            .map_err(|_| (ErrorCode::ShuttingDown, "shard 0 stopped".to_string()))?;
        match answer.recv_async().await {
            Ok(Outcome { error: 0, .. }) => Ok(()),
            Ok(outcome) => {
                let code = ErrorCode::from_u32(outcome.error).unwrap_or(ErrorCode::InvalidRequest);
                Err((code, outcome.text()))
            }
            Err(_) => Err((ErrorCode::ShuttingDown, "shard 0 stopped".to_string())),
        }
    }
}

/// A metadata refusal in an admin API's terms: a node that is not the metadata primary is not
/// the controller (the client asks Metadata for the controller again).
fn admin_error((code, message): (ErrorCode, String)) -> (ResponseError, String) {
    let error = match code {
        ErrorCode::NotPrimary => ResponseError::NotController,
        ErrorCode::TopicExists => ResponseError::TopicAlreadyExists,
        ErrorCode::TopicNotFound | ErrorCode::StreamNotFound => {
            ResponseError::UnknownTopicOrPartition
        }
        ErrorCode::InvalidName => ResponseError::InvalidTopicException,
        ErrorCode::LimitReached => ResponseError::PolicyViolation,
        ErrorCode::InvalidArgument => ResponseError::InvalidConfig,
        other => kafka_error(other as u32).unwrap_or(ResponseError::UnknownServerError),
    };
    (error, message)
}

/// The CreatePartitions response: each topic grown in turn to its new count (placed as its
/// first partitions were; a replica assignment is INVALID_REPLICA_ASSIGNMENT, since every node
/// holds every partition).
pub(super) async fn create_partitions(
    connection: &mut Connection,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let outcome = connection.add_partitions(&topic, request.validate_only).await;
        let result = CreatePartitionsTopicResult::default()
            .with_name(TopicName(StrBytes::from_string(topic.name)));
        results.push(match outcome {
            Ok(()) => result.with_error_message(None),
            Err((error, message)) => result
                .with_error_code(error.code())
                .with_error_message(Some(StrBytes::from_string(message))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}

impl Connection {
    async fn add_partitions(
        &mut self,
        topic: &CreatePartitionsTopic,
        validate_only: bool,
    ) -> Result<(), (ResponseError, String)> {
        let (name, current) = self
            .find_topic(Some(&topic.name), &[0; 16])
            .map(|(name, found)| (name, found.partitions.len()))
            .map_err(|error| (error, format!("no topic {}", topic.name)))?;
        if topic.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                "replicas are not assigned by hand: every node holds every partition".into(),
            ));
        }
        let config = &self.context.config;
        let partitions_max = config.metadata.topic_partitions_max;
        let count = u32::try_from(topic.count).unwrap_or(0);
        if count as usize <= current || count > partitions_max {
            return Err((
                ResponseError::InvalidPartitions,
                format!(
                    "{}: {name} has {current} partitions; ask for more, at most {partitions_max}                      ([metadata] topic_partitions_max)",
                    topic.count
                ),
            ));
        }
        if validate_only {
            return Ok(());
        }
        let command = MetaCommand::AddPartitions {
            stream: config.kafka.stream.clone(),
            topic: name,
            partitions: count,
            nodes: config.cluster.founders(),
        };
        self.propose(Operation::CreateTopic, command).await.map_err(|refused| match refused {
            (ErrorCode::InvalidArgument, message) => (ResponseError::InvalidPartitions, message),
            refused => admin_error(refused),
        })
    }
}

/// Creates the topics a Metadata request names that do not exist, when `[kafka]
/// auto_create_topics` is on and the request allows it (Kafka's `auto.create.topics.enable`),
/// with the `[topic_defaults]`. One that cannot be created is then answered as unknown.
pub(super) async fn auto_create(connection: &mut Connection, request: &MetadataRequest) {
    if !connection.context.config.kafka.auto_create_topics || !request.allow_auto_topic_creation {
        return;
    }
    let Some(topics) = &request.topics else { return };
    for name in topics.iter().filter_map(|topic| topic.name.as_deref()) {
        if connection.find_topic(Some(name), &[0; 16]).is_ok() {
            continue;
        }
        let topic = shoal_kafka::request::CreateTopic {
            name: name.to_string(),
            num_partitions: -1,
            replication_factor: -1,
            assignments: Vec::new(),
            configs: Vec::new(),
        };
        match connection.create_topic(topic, false).await {
            Ok(_) => tracing::info!(topic = name, "Kafka topic created on first use"),
            Err((error, message)) => {
                tracing::debug!(topic = name, ?error, message, "Kafka topic not auto-created")
            }
        }
        connection.context.published.refresh(&mut connection.catalog);
    }
}

/// The DeleteTopics response: each topic (by name, or v6 by id) deleted in turn.
pub(super) async fn delete_topics(
    connection: &mut Connection,
    request: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for asked in request.topics {
        let found = connection
            .find_topic(asked.name.as_deref(), &asked.topic_id)
            .map(|(name, topic)| (name, connection.topic_id(topic)));
        let outcome = match found {
            Err(error) => Err((error, String::new())),
            Ok((name, id)) => {
                let command = MetaCommand::DeleteTopic {
                    stream: connection.context.config.kafka.stream.clone(),
                    topic: name.clone(),
                    frees_groups: true,
                };
                connection
                    .propose(Operation::DeleteTopic, command)
                    .await
                    .map(|()| (name, id))
                    .map_err(admin_error)
            }
        };
        let result = match outcome {
            Ok((name, id)) => DeletableTopicResult::default()
                .with_name(Some(TopicName(StrBytes::from_string(name))))
                .with_topic_id(shoal_kafka::Uuid::from_bytes(id)),
            Err((error, message)) => DeletableTopicResult::default()
                .with_name(asked.name.map(|n| TopicName(StrBytes::from_string(n))))
                .with_topic_id(shoal_kafka::Uuid::from_bytes(asked.topic_id))
                .with_error_code(error.code())
                .with_error_message((!message.is_empty()).then(|| StrBytes::from_string(message))),
        };
        results.push(result);
    }
    DeleteTopicsResponse::default().with_responses(results)
}

/// The DescribeConfigs response: a topic's configs (all, or the names asked); a broker has
/// none to show.
pub(super) fn describe_configs(
    connection: &Connection,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    // What a topic created with no config has: a config equal to it reads as the default.
    let defaults =
        topic_configs(&TopicSettings::from_defaults(&connection.context.config.topic_defaults));
    let results = request
        .resources
        .into_iter()
        .map(|resource| {
            let result = DescribeConfigsResult::default()
                .with_error_message(None)
                .with_resource_type(resource.resource_type)
                .with_resource_name(StrBytes::from_string(resource.resource_name.clone()));
            match resource.resource_type {
                TOPIC_RESOURCE_TYPE => {
                    match connection.find_topic(Some(&resource.resource_name), &[0; 16]) {
                        Err(error) => result.with_error_code(error.code()),
                        Ok((_, topic)) => {
                            let configs = topic_configs(&topic.settings)
                                .into_iter()
                                .filter(|(name, _)| {
                                    // None or none named: every config.
                                    resource.configuration_keys.as_ref().is_none_or(|keys| {
                                        keys.is_empty() || keys.iter().any(|k| k == name)
                                    })
                                })
                                .map(|(name, value)| {
                                    let default = defaults.iter().find(|(n, _)| *n == name);
                                    let source = if default.is_some_and(|(_, v)| *v == value) {
                                        SOURCE_DEFAULT
                                    } else {
                                        SOURCE_TOPIC
                                    };
                                    DescribeConfigsResourceResult::default()
                                        .with_name(StrBytes::from_static_str(name))
                                        .with_value(Some(StrBytes::from_string(value)))
                                        .with_read_only(true)
                                        .with_config_source(source)
                                })
                                .collect();
                            result.with_configs(configs)
                        }
                    }
                }
                BROKER_RESOURCE_TYPE => result,
                _ => result.with_error_code(ResponseError::InvalidRequest.code()),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// The DescribeCluster response: one broker per node with a Kafka address.
pub(super) async fn describe_cluster(connection: &Connection) -> DescribeClusterResponse {
    let brokers = connection
        .broker_addresses()
        .into_iter()
        .map(|(node, address, rack)| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(i32::from(node)))
                .with_host(StrBytes::from_string(address.ip().to_string()))
                .with_port(i32::from(address.port()))
                .with_rack(rack.map(StrBytes::from_string))
        })
        .collect();
    let controller = connection.coordinator().await.map_or(-1, |(node, _, _)| node);
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(connection.cluster_id()))
        .with_controller_id(BrokerId(controller))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(OPERATIONS_NOT_ASKED)
}

/// The DescribeGroups response: each group the coordinator keeps; one it does not (no members
/// now) is `Dead`, as Kafka answers for a group it does not know.
pub(super) async fn describe_groups(
    connection: &Connection,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    // A group named twice is described once: each repeat would carry every member's
    // metadata and assignment again.
    let mut seen = std::collections::HashSet::new();
    let names: Vec<String> =
        request.groups.into_iter().filter(|n| seen.insert(n.clone())).collect();
    let ask = KafkaGroupRequest::Describe { groups: names.clone() };
    let described = match connection.ask_coordinator(ask).await {
        KafkaGroupReply::Described(described) => Ok(described),
        _ => Err(ResponseError::NotCoordinator),
    };
    let groups = names
        .into_iter()
        .enumerate()
        .map(|(index, name)| {
            let group = DescribedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(name)))
                .with_authorized_operations(OPERATIONS_NOT_ASKED);
            match &described {
                Err(error) => group.with_error_code(error.code()),
                Ok(described) => match described.get(index).cloned().flatten() {
                    None => group.with_group_state(StrBytes::from_static_str("Dead")),
                    Some(description) => {
                        let members = description
                            .members
                            .into_iter()
                            .map(|member| {
                                DescribedGroupMember::default()
                                    .with_member_id(StrBytes::from_string(member.member_id))
                                    .with_client_id(StrBytes::from_string(member.client_id))
                                    .with_member_metadata(member.metadata)
                                    .with_member_assignment(member.assignment)
                            })
                            .collect();
                        group
                            .with_group_state(StrBytes::from_static_str(description.state.name()))
                            .with_protocol_type(StrBytes::from_string(description.protocol_type))
                            .with_protocol_data(StrBytes::from_string(description.protocol))
                            .with_members(members)
                    }
                },
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

/// The ListGroups response: the groups the coordinator keeps (with members), filtered by state
/// (v4+) and type (v5+: only "classic" groups exist here).
pub(super) async fn list_groups(
    connection: &Connection,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let listed = match connection.ask_coordinator(KafkaGroupRequest::List).await {
        KafkaGroupReply::Listed(listed) => listed,
        _ => {
            return ListGroupsResponse::default()
                .with_error_code(ResponseError::NotCoordinator.code());
        }
    };
    let wanted_state = |state: GroupState| {
        request.states_filter.is_empty()
            || request.states_filter.iter().any(|s| s.eq_ignore_ascii_case(state.name()))
    };
    let wanted_type = request.types_filter.is_empty()
        || request.types_filter.iter().any(|t| t.eq_ignore_ascii_case("classic"));
    let groups = listed
        .into_iter()
        .filter(|&(_, _, state)| wanted_type && wanted_state(state))
        .map(|(name, protocol_type, state)| {
            ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(name)))
                .with_protocol_type(StrBytes::from_string(protocol_type))
                .with_group_state(StrBytes::from_static_str(state.name()))
                .with_group_type(StrBytes::from_static_str("classic"))
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
