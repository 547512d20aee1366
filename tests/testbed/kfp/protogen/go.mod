module trainflow.dev/testbed/kfp/protogen

go 1.26.0

// The versions KFP 2.14.3's go.mod requires (protoc-gen-go = the protobuf runtime it generates for).
require (
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250715232539-7130f93afb79
	google.golang.org/protobuf v1.36.6
)

// The older api module (the newest the proxy serves): only its cache_key.proto descriptor is used.
require github.com/kubeflow/pipelines/api v0.0.0-20250102152816-873e9dedd766
