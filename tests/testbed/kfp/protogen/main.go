// Command protogen writes Go bindings for serialized protobuf file descriptors, with the generator
// of protoc-gen-go (google.golang.org/protobuf/cmd/protoc-gen-go, the version this module pins).
//
// Why it exists: the trainflow test bed builds the KFP 2.14.3 backend from the Go module proxy,
// which serves github.com/kubeflow/pipelines at the 2.14.3 commit but not its two sub-modules
// github.com/kubeflow/pipelines/api and .../kubernetes_platform at that commit (only at 2025-01
// and 2024-07 commits, which lack messages the 2.14.3 backend uses, e.g. WorkspaceConfig). Their
// Go code is protoc-gen-go's output for api/v2alpha1/pipeline_spec.proto and
// kubernetes_platform/proto/kubernetes_executor_config.proto; the same two files, compiled, are
// published on PyPI as the Python packages of the same release (kfp-pipeline-spec 2.14.0 and
// kfp-kubernetes 2.14.3 embed each file's FileDescriptorProto in their *_pb2.py). This command
// turns those descriptors back into the Go packages (tests/testbed/kfp/gen-api.sh drives it).
// The result differs from upstream's checked-in .pb.go only in what a descriptor does not carry:
// comments, and the protoc version line in the header.
//
// cache_key.proto (package cachekey of the api module) is not on PyPI. Its descriptor is linked into
// this program from the older api module the proxy serves (imported below), and "-linked
// cache_key.proto" generates it too, against the new pipeline_spec.proto given as input (it only
// refers to messages that exist in both).
//
// Usage:
//
//	protogen -out DIR [-linked NAME.proto]... FILE.pb...
//
// Each FILE.pb is one serialized google.protobuf.FileDescriptorProto. Imports that are not among
// the inputs are resolved from the descriptors linked into this program (the well-known types and
// google/rpc/status.proto). Files are written under DIR at their go_package import path
// (protoc-gen-go's paths=import).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/kubeflow/pipelines/api/v2alpha1/go/cachekey" // registers cache_key.proto (older api module)
	_ "google.golang.org/genproto/googleapis/rpc/status"       // registers google/rpc/status.proto
	gengo "google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	_ "google.golang.org/protobuf/types/known/anypb"
	_ "google.golang.org/protobuf/types/known/durationpb"
	_ "google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	out := flag.String("out", "", "folder to write the generated files under (required)")
	var linked stringList
	flag.Var(&linked, "linked", "a .proto linked into protogen to generate as well (repeatable)")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: protogen -out DIR [-linked NAME.proto]... FILE.pb...")
		os.Exit(2)
	}
	if err := run(*out, flag.Args(), linked); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return fmt.Sprint(*l) }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func run(out string, paths []string, linked []string) error {
	inputs := map[string]*descriptorpb.FileDescriptorProto{}
	var toGenerate []string
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			return fmt.Errorf("%s: not a FileDescriptorProto: %w", path, err)
		}
		inputs[fd.GetName()] = fd
		toGenerate = append(toGenerate, fd.GetName())
	}
	for _, name := range linked {
		if _, err := protoregistry.GlobalFiles.FindFileByPath(name); err != nil {
			return fmt.Errorf("-linked %s: %w", name, err)
		}
		toGenerate = append(toGenerate, name)
	}
	// Every file the inputs import, dependencies before their dependents (protoc's order).
	var ordered []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		if seen[name] {
			return nil
		}
		seen[name] = true
		fd, ok := inputs[name]
		if !ok {
			linked, err := protoregistry.GlobalFiles.FindFileByPath(name)
			if err != nil {
				return fmt.Errorf("import %q is neither an input nor linked into protogen: %w", name, err)
			}
			fd = protodesc.ToFileDescriptorProto(linked)
		}
		for _, dep := range fd.GetDependency() {
			if err := visit(dep); err != nil {
				return err
			}
		}
		ordered = append(ordered, fd)
		return nil
	}
	for _, name := range toGenerate {
		if err := visit(name); err != nil {
			return err
		}
	}
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: toGenerate,
		Parameter:      proto.String("paths=import"),
		ProtoFile:      ordered,
	}
	gen, err := protogen.Options{}.New(req)
	if err != nil {
		return err
	}
	for _, f := range gen.Files {
		if f.Generate {
			gengo.GenerateFile(gen, f)
		}
	}
	resp := gen.Response()
	if resp.Error != nil {
		return fmt.Errorf("generator: %s", resp.GetError())
	}
	for _, f := range resp.File {
		dst := filepath.Join(out, filepath.FromSlash(f.GetName()))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, []byte(f.GetContent()), 0o644); err != nil {
			return err
		}
		fmt.Println(dst)
	}
	return nil
}
