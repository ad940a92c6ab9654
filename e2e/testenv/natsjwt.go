package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// JetStream limits of an account with `jetstream: enabled` in JWT mode: real limits
// (a JWT account without them has no JetStream), sized like the server's own.
var jwtJetStreamLimits = jwt.JetStreamLimits{
	MemoryStorage: 256 << 20,
	DiskStorage:   2 << 30,
	Streams:       32,
	Consumer:      jwt.NoLimit,
	MaxAckPending: jwt.NoLimit,
}

// natsJWTOptions turns the accounts file of --nats-secure into operator (JWT) mode for
// --nats-jwt: the same accounts, users, permissions, exports and imports, as an operator,
// account and user JWTs instead of a users list, so what the JWT tests run cannot drift
// from examples/nats/herald-accounts.conf. parsed holds the options nats-server made of
// that file (the users and their permissions as the server understood them); the
// account-level settings are read from the file itself, and one this does not translate
// is an error rather than silently dropped.
//
// Written to out (DIR/nats-secure/): operator.jwt, <identity>.creds (user JWT + the
// seed of <identity>.nk) per identity. A user's permissions are the scope (role) of a
// signing key of its account that issues its JWT; a user without permissions (admin)
// is issued by the account key itself. The server configuration (TLS as in
// --nats-secure, `operator`, `system_account`, `resolver: MEMORY` and
// `resolver_preload`) is written to confDir/nats-server-jwt.conf and returned parsed.
func natsJWTOptions(out, confDir, accountsFile string, parsed *server.Options) (*server.Options, error) {
	if len(parsed.Users) > 0 {
		return nil, errors.New("--nats-jwt: the accounts file has password users; JWT mode translates NKey users only")
	}
	// Which identity each public key is (the seeds natsSecureOptions wrote).
	identityOf := map[string]string{}
	seedOf := map[string][]byte{}
	for _, id := range secureIdentities {
		seed, err := os.ReadFile(filepath.Join(out, id+".nk"))
		if err != nil {
			return nil, err
		}
		seed = []byte(strings.TrimSpace(string(seed)))
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		public, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		identityOf[public] = id
		seedOf[id] = seed
	}

	raw, err := conf.ParseFile(accountsFile)
	if err != nil {
		return nil, fmt.Errorf("--nats-jwt: %s: %w", accountsFile, err)
	}
	accountsBlock, ok := raw["accounts"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("--nats-jwt: %s has no accounts block", accountsFile)
	}

	operatorKP, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	operatorPub, _ := operatorKP.PublicKey()
	names := make([]string, 0, len(accountsBlock)+1)
	for name := range accountsBlock {
		names = append(names, name)
	}
	sort.Strings(names)
	const system = "SYS"
	if _, taken := accountsBlock[system]; taken {
		return nil, fmt.Errorf("--nats-jwt: the accounts file defines %s, the system account's name here", system)
	}
	keys := map[string]nkeys.KeyPair{}
	claims := map[string]*jwt.AccountClaims{}
	for _, name := range append(names, system) {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, err
		}
		public, _ := kp.PublicKey()
		keys[name] = kp
		claims[name] = jwt.NewAccountClaims(public)
		claims[name].Name = name
	}
	pub := func(name string) (string, error) {
		kp, ok := keys[name]
		if !ok {
			return "", fmt.Errorf("--nats-jwt: unknown account %q", name)
		}
		return kp.PublicKey()
	}

	// Exports first (imports need to know which exports require a token).
	restricted := map[string]map[string]bool{} // "ACCOUNT service SUBJECT" -> importers
	for _, name := range names {
		block, ok := accountsBlock[name].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("--nats-jwt: account %s is not a block", name)
		}
		for key, value := range block {
			switch key {
			case "users", "imports":
			case "jetstream":
				if value == "enabled" || value == true {
					claims[name].Limits.JetStreamLimits = jwtJetStreamLimits
				} else {
					return nil, fmt.Errorf("--nats-jwt: account %s: jetstream %v not translated", name, value)
				}
			case "exports":
				for _, e := range asList(value) {
					export, err := jwtExport(e)
					if err != nil {
						return nil, fmt.Errorf("--nats-jwt: account %s: %w", name, err)
					}
					if to := asList(e.(map[string]any)["accounts"]); len(to) > 0 {
						export.TokenReq = true
						importers := map[string]bool{}
						for _, a := range to {
							importers[fmt.Sprint(a)] = true
						}
						restricted[name+" "+export.Type.String()+" "+string(export.Subject)] = importers
					}
					claims[name].Exports.Add(export)
				}
			default:
				return nil, fmt.Errorf("--nats-jwt: account %s: %q is not translated to JWT", name, key)
			}
		}
	}
	for _, name := range names {
		for _, i := range asList(accountsBlock[name].(map[string]any)["imports"]) {
			im, from, err := jwtImport(i)
			if err != nil {
				return nil, fmt.Errorf("--nats-jwt: account %s: %w", name, err)
			}
			if im.Account, err = pub(from); err != nil {
				return nil, err
			}
			if importers, ok := restricted[from+" "+im.Type.String()+" "+string(im.Subject)]; ok {
				if !importers[name] {
					return nil, fmt.Errorf("--nats-jwt: account %s imports %s from %s, which does not export it to it", name, im.Subject, from)
				}
				importer, _ := pub(name)
				activation := jwt.NewActivationClaims(importer)
				activation.ImportSubject = im.Subject
				activation.ImportType = im.Type
				if im.Token, err = activation.Encode(keys[from]); err != nil {
					return nil, err
				}
			}
			claims[name].Imports.Add(im)
		}
	}

	// Users: one per identity, with the permissions the server parsed.
	seen := map[string]bool{}
	for _, user := range parsed.Nkeys {
		id, ok := identityOf[user.Nkey]
		if !ok {
			return nil, fmt.Errorf("--nats-jwt: user %s is not one of testenv's identities", user.Nkey)
		}
		if user.Account == nil {
			return nil, fmt.Errorf("--nats-jwt: user %s is in no account", id)
		}
		account := user.Account.GetName()
		kp, ok := keys[account]
		if !ok {
			return nil, fmt.Errorf("--nats-jwt: user %s is in account %s, which the file does not define", id, account)
		}
		uc := jwt.NewUserClaims(user.Nkey)
		uc.Name = id
		signer := kp
		if p := user.Permissions; p != nil {
			// The permissions go into a scoped signing key of the account (a role, as
			// `nsc edit signing-key --role` makes), and the user JWT is issued by that
			// key: the dispatcher's list in the user JWT itself would make a CONNECT
			// longer than nats-server's default max_control_line (4 KB).
			var perms jwt.Permissions
			if p.Publish != nil {
				perms.Pub.Allow.Add(p.Publish.Allow...)
				perms.Pub.Deny.Add(p.Publish.Deny...)
			}
			if p.Subscribe != nil {
				perms.Sub.Allow.Add(p.Subscribe.Allow...)
				perms.Sub.Deny.Add(p.Subscribe.Deny...)
			}
			if p.Response != nil {
				perms.Resp = &jwt.ResponsePermission{MaxMsgs: p.Response.MaxMsgs, Expires: p.Response.Expires}
			}
			if signer, err = nkeys.CreateAccount(); err != nil {
				return nil, err
			}
			scope := jwt.NewUserScope()
			scope.Key, _ = signer.PublicKey()
			scope.Role = id
			scope.Template.Permissions = perms
			claims[account].SigningKeys.AddScopedSigner(scope)
			uc.IssuerAccount, _ = kp.PublicKey()
			// A scoped key's users carry no permissions or limits of their own.
			uc.UserPermissionLimits = jwt.UserPermissionLimits{}
		}
		token, err := uc.Encode(signer)
		if err != nil {
			return nil, err
		}
		creds, err := jwt.FormatUserConfig(token, seedOf[id])
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(out, id+".creds"), creds, 0o600); err != nil {
			return nil, err
		}
		seen[id] = true
	}
	for _, id := range secureIdentities {
		if !seen[id] {
			return nil, fmt.Errorf("--nats-jwt: the accounts file has no user for $HERALD_%s_NKEY", strings.ToUpper(strings.ReplaceAll(id, "-", "_")))
		}
	}

	oc := jwt.NewOperatorClaims(operatorPub)
	oc.Name = "herald-testenv"
	systemPub, _ := pub(system)
	oc.SystemAccount = systemPub
	operatorJWT, err := oc.Encode(operatorKP)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, "operator.jwt"), []byte(operatorJWT), 0o600); err != nil {
		return nil, err
	}
	var preload strings.Builder
	for _, name := range append(names, system) {
		token, err := claims[name].Encode(operatorKP)
		if err != nil {
			return nil, fmt.Errorf("--nats-jwt: account %s: %w", name, err)
		}
		public, _ := pub(name)
		fmt.Fprintf(&preload, "  # %s\n  %s: %q\n", name, public, token)
	}
	main := fmt.Sprintf(`# written by testenv run --nats-secure %s --nats-jwt
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
  timeout: 5
}
operator: %q
system_account: %s
resolver: MEMORY
resolver_preload: {
%s}
`, accountsFile, filepath.Join(out, "server.crt"), filepath.Join(out, "server.key"), filepath.Join(out, "ca.pem"),
		filepath.Join(out, "operator.jwt"), systemPub, preload.String())
	confFile := filepath.Join(confDir, "nats-server-jwt.conf")
	if err := os.WriteFile(confFile, []byte(main), 0o600); err != nil {
		return nil, err
	}
	opts, err := server.ProcessConfigFile(confFile)
	if err != nil {
		return nil, fmt.Errorf("nats: %s: %w", confFile, err)
	}
	return opts, nil
}

func asList(v any) []any {
	list, _ := v.([]any)
	return list
}

// jwtExport translates one `exports` entry: {service|stream: SUBJECT, accounts: [...]}.
func jwtExport(e any) (*jwt.Export, error) {
	m, ok := e.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("export %v is not a map", e)
	}
	export := &jwt.Export{}
	for key, value := range m {
		switch key {
		case "service":
			export.Type = jwt.Service
			export.Subject = jwt.Subject(fmt.Sprint(value))
		case "stream":
			export.Type = jwt.Stream
			export.Subject = jwt.Subject(fmt.Sprint(value))
		case "accounts":
		default:
			return nil, fmt.Errorf("export setting %q is not translated to JWT", key)
		}
	}
	if export.Subject == "" {
		return nil, fmt.Errorf("export %v has no subject", e)
	}
	return export, nil
}

// jwtImport translates one `imports` entry: {service|stream: {account, subject}, to}.
// It returns the import (without the exporter's public key) and the exporter's name.
func jwtImport(i any) (*jwt.Import, string, error) {
	m, ok := i.(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("import %v is not a map", i)
	}
	im := &jwt.Import{}
	var from string
	for key, value := range m {
		switch key {
		case "service", "stream":
			im.Type = jwt.Service
			if key == "stream" {
				im.Type = jwt.Stream
			}
			source, ok := value.(map[string]any)
			if !ok {
				return nil, "", fmt.Errorf("import %v: %s is not a map", i, key)
			}
			for k, v := range source {
				switch k {
				case "account":
					from = fmt.Sprint(v)
				case "subject":
					im.Subject = jwt.Subject(fmt.Sprint(v))
				default:
					return nil, "", fmt.Errorf("import source setting %q is not translated to JWT", k)
				}
			}
		case "to":
			im.LocalSubject = jwt.RenamingSubject(fmt.Sprint(value))
		default:
			return nil, "", fmt.Errorf("import setting %q is not translated to JWT", key)
		}
	}
	if from == "" || im.Subject == "" {
		return nil, "", fmt.Errorf("import %v needs an account and a subject", i)
	}
	return im, from, nil
}
