package main

// What GitOps tools make of Herald's resources, computed the way the tools do it, for
// the e2e tests: Argo CD runs a resource's Lua health script with gopher-lua (the
// interpreter Argo CD embeds), and Flux's `wait` uses kstatus (sigs.k8s.io/cli-utils).
// Both read one object as JSON on stdin and print {"status": ..., "message": ...}.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func readObject() (map[string]any, error) {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("stdin is not a JSON object: %w", err)
	}
	return obj, nil
}

func printVerdict(v verdict) error {
	return json.NewEncoder(os.Stdout).Encode(v)
}

// argoHealth runs an Argo CD health script: the object is the global `obj`, the script
// returns a table with `status` and `message`. Only the libraries Argo CD opens.
func argoHealth(script string) error {
	obj, err := readObject()
	if err != nil {
		return err
	}
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoFile(script); err != nil {
		return err
	}
	table, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return errors.New("the script did not return a table")
	}
	return printVerdict(verdict{
		Status:  table.RawGetString("status").String(),
		Message: table.RawGetString("message").String(),
	})
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := L.NewTable()
		for _, item := range v {
			t.Append(toLua(L, item))
		}
		return t
	case map[string]any:
		t := L.NewTable()
		for key, item := range v {
			t.RawSetString(key, toLua(L, item))
		}
		return t
	default:
		return lua.LString(fmt.Sprint(v))
	}
}

// kstatusOf computes the object's status as kstatus (and so Flux's `wait`) does.
func kstatusOf() error {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	// Unstructured's own decoder keeps integers int64, as kstatus expects.
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return fmt.Errorf("stdin is not a Kubernetes object: %w", err)
	}
	result, err := status.Compute(u)
	if err != nil {
		return err
	}
	return printVerdict(verdict{Status: result.Status.String(), Message: result.Message})
}
